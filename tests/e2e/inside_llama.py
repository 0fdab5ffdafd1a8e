"""The admin's side of the llama.cpp end-to-end test (tests/e2e/test_llama.py), run inside
the booted bare machine by the same oneshot driver unit as tests/e2e/inside.py, whose helpers
it reuses (copied beside it into /opt/e2e). The machine is the bare Debian of README command
1 (no venv module, no compiler, no network), with llama-server already built in
/opt/epyc-llm/llama-runtime (the recipe's finished folder, built on this CPU by
tests/tools/llama_server.sh) and a GGUF file in /srv/models. One phase per boot:

install  README command 1 with the engine chosen: `install.sh --engine llama.cpp` (the venv
         module and g++ from apt, the recipe finds its build done), then `epycctl quickstart
         --engine llama.cpp --model FILE --yes` -> ready, the hand-off, a chat, status; the
         server's own process: its CPUs, threads and argv
reboot   back with no new approval: status ready, a chat; llama-server killed (kill -9),
         then stopped (SIGSTOP, systemd's watchdog): each time ready again with no action
set      the single endpoint removed, Debian's HAProxy installed (.debs from the test cache),
         an endpoint of 2 llama-servers behind it approved: the units, status, chats through
         the balancer counted by each instance's own /metrics, instance 2 killed and back,
         instance 1 stopped (SIGSTOP) and back
set_reboot  the set back with no new approval: its units, status ready, a chat
gateway  the gateway (HTTPS with a self-signed certificate) in front of the set, three
         keys: chats, /v1/models, its refusals (401, 403, 404, 429), a streamed chat that a
         reload in its middle does not cut; the set removed and the tiny BERT embedder
         approved: the routes follow on the same URL, with no restart of the gateway
on_demand  the embedder removed; a chat and an embedder approved on demand, one swap seat
         behind the gateway: idle, a 403, each request answered and the other engine
         stopped, neither running after the idle time, the cold starts and response times
on_demand_reboot  nothing runs after the boot until a request, which is answered
"""

from __future__ import annotations

import json
import signal
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import inside
from inside import (
    CONFIG,
    METRICS,
    PhaseFailed,
    endpoint_entry,
    endpoint_state,
    engine_fault,
    epycctl_status,
    hang_instance,
    instance_metrics,
    journal,
    must,
    read_json,
    record,
    run,
    show,
    signalled,
    use_identity_root,
    wait_for_daemon,
    wait_until,
)

PREFIX = Path("/opt/epyc-llm")
NAME = "default"
UNIT = f"epyc-llm-{NAME}.service"
UNIT_FILE = Path("/etc/systemd/system") / UNIT
ENDPOINT_FILE = Path("/etc/epyc-llm") / f"{NAME}.toml"
inside.UNIT = UNIT
inside.NAME = NAME
inside.SUPERVISOR_STATUS = Path("/run/epyc-llm/endpoints") / NAME / "status.json"
inside.CRASH_RECORD = Path("/var/lib/epyc-llm/crashloop") / f"epyc-llm-{NAME}.json"
inside.ENV |= {"PIP_INDEX_URL": f"file://{CONFIG['pypi']}", "PIP_CACHE_DIR": "/root/.cache/pip"}

CHAT = """
import json, sys
import httpx
url, *named = sys.argv[1:]
model = named[0] if named else httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]
reply = httpx.post(url + "/chat/completions", timeout=60, json={
    "model": model, "messages": [{"role": "user", "content": "Say hello"}],
    "temperature": 0, "max_tokens": 8}).json()
print(json.dumps({"choices": len(reply["choices"]), "model": reply["model"],
                  "completion_tokens": reply["usage"]["completion_tokens"]}))
"""


COMPLETION = """
import json, sys
import httpx
url, prompt = sys.argv[1:]
model = httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]
reply = httpx.post(url + "/completions", timeout=60, json={
    "model": model, "prompt": prompt, "temperature": 0, "max_tokens": 8}).json()
print(json.dumps({"text": reply["choices"][0]["text"]}))
"""
QUESTION = "Q: What is the capital of France?\nA:"


def status_url_of(name: str, check: str) -> str | None:
    """`epycctl status NAME` recorded as `check`, and the endpoint's URL (with /v1) in it."""
    url = endpoint_entry(epycctl_status(check, name), name).get("url")
    return None if url is None else str(url)


def status_url(check: str) -> str | None:
    return status_url_of(NAME, check)


def chat(check: str, url: str | None, model: str | None = None) -> None:
    """One chat at `url`; the model's name from its /v1/models unless `model` names it (one
    request per chat: through a balancer, a list before every chat would send every list to
    one instance and every chat to the other)."""
    if url is None:
        record(check, rc=None, reply=None, stderr="no URL in status")
        return
    named = [] if model is None else [model]
    done = run(str(PREFIX / "bin" / "python"), "-c", CHAT, url, *named, timeout=120)
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, url=url, stderr=done["stderr"][-3000:])


def completion(check: str, url: str | None) -> None:
    """The quickstart's model completes `QUESTION` at temperature 0."""
    if url is None:
        record(check, rc=None, reply=None, stderr="no URL in status")
        return
    done = run(str(PREFIX / "bin" / "python"), "-c", COMPLETION, url, QUESTION, timeout=120)
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, stderr=done["stderr"][-3000:])


def server_facts(pid: str) -> dict[str, object]:
    """One llama-server as the kernel sees it: its CPUs, threads, user, argv and memory."""
    proc = Path("/proc") / pid
    lines = (proc / "status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    return {
        "pid": int(pid),
        "argv": (proc / "cmdline").read_text().split("\0")[:-1],
        "cpus": fields["Cpus_allowed_list"].strip(),
        "mems": fields["Mems_allowed_list"].strip(),
        "threads": int(fields["Threads"]),
        "uid": fields["Uid"].split()[0],
        "locked_kib": int(fields["VmLck"].split()[0]),
        "memlock_limit": next(
            (line for line in (proc / "limits").read_text().splitlines() if "locked" in line), ""
        ),
        "numa_policy": run("sh", "-c", f"head -1 /proc/{pid}/numa_maps")["stdout"].strip(),
    }


def server_process(check: str) -> None:
    """The (single endpoint's one) llama-server."""
    found = run("pgrep", "-x", "llama-server")["stdout"].split()
    if not found:
        record(check, pid=None)
        return
    record(check, **server_facts(found[0]))


def fresh_machine() -> None:
    tools = ("g++", "c++", "podman", "docker", "vllm", "epycctl", "pip", "pip3")
    found = {tool: run("sh", "-c", f"command -v {tool}")["stdout"].strip() for tool in tools}
    record(
        "fresh",
        found=found,
        ensurepip=run("python3", "-c", "import ensurepip")["rc"] == 0,
        pypi_resolves=run("getent", "hosts", "pypi.org")["rc"] == 0,
    )


def phase_install() -> None:
    argv = ("epycctl", "quickstart", "--engine", "llama.cpp", "--model", CONFIG["quickstart_gguf"],
            "--yes")  # fmt: skip
    install_then_quickstart(
        ("/src/packaging/install.sh", "--engine", "llama.cpp"), 1500, argv,
        after_ready=lambda: completion("completion", status_url("status")),
    )  # fmt: skip


def install_then_quickstart(
    install: tuple[str, ...],
    install_timeout: int,
    quickstart: tuple[str, ...],
    after_quickstart: Callable[[], None] = lambda: None,
    after_ready: Callable[[], None] = lambda: None,
) -> None:
    """A fresh machine: `install`, the model's files given to the epyc-llm group, the EPYC
    identity root, then `quickstart` (timed; `after_quickstart` records what it left, also
    when it failed); the ready endpoint's unit, files, a chat (and what `after_ready` asks)
    and its server process."""
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    fresh_machine()
    started = time.monotonic()
    must("install", *install, timeout=install_timeout)
    installed = time.monotonic()
    must("model_group", "chgrp", "-R", "epyc-llm", CONFIG["model_dir"], timeout=60)
    must("model_mode", "chmod", "-R", "u+rwX,g+rX,g-w,o-rwx", CONFIG["model_dir"], timeout=60)
    use_identity_root()
    done = run(*quickstart, timeout=900, check="quickstart")
    record(
        "timing",
        install_s=round(installed - started, 1),
        quickstart_s=done["seconds"],
        fresh_to_ready_s=round(time.monotonic() - started, 1),
    )
    after_quickstart()
    if done["rc"] != 0:
        journal("journal_serving", UNIT)
        raise PhaseFailed(f"quickstart failed (exit {done['rc']}): {done['stderr'][-2000:]}")
    record("unit", **show(UNIT))
    record(
        "memlock",
        pid1=next(x for x in Path("/proc/1/limits").read_text().splitlines() if "locked" in x),
        **show(UNIT, "LimitMEMLOCK", "LimitMEMLOCKSoft"),
    )
    record("unit_file", text=UNIT_FILE.read_text())
    record("endpoint_file", text=ENDPOINT_FILE.read_text())
    chat("chat", status_url("status"))
    after_ready()
    server_process("server")
    journal("journal_serving", UNIT)


def phase_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_until(
        "the endpoint unit settles",
        lambda: show(UNIT, "ActiveState")["ActiveState"] in {"active", "failed"},
        600,
    )
    record("unit", **show(UNIT))
    chat("chat", status_url("status"))
    server_process("server")
    url = status_url("status_before_faults")
    record("crash_record_before_faults", record=inside.read_json(inside.CRASH_RECORD))
    for check, sig in (("kill_server", signal.SIGKILL), ("stop_server", signal.SIGSTOP)):
        engine_fault(check, signalled(sig, whole_engine=True), lambda c: chat(c, url))


SET = CONFIG["set_name"]
SET_UNITS = tuple(f"epyc-llm-{SET}{suffix}.service" for suffix in ("", "_1", "_2"))
SET_CHATS = 6


def set_units(check: str) -> None:
    record(check, units={unit: show(unit) for unit in SET_UNITS})


def member_ports() -> list[int]:
    approval = json.loads(Path(f"/var/lib/epyc-llm/approvals/{SET}.json").read_text())
    return [int(m["port"]) for m in approval["plan"]["decisions"]["servers"]]


def predicted_tokens(port: int) -> float | str:
    """An instance's own count of the tokens it generated (llama-server's --metrics). Not its
    prompt tokens: a prompt it has seen comes from its prompt cache and counts none."""
    text = instance_metrics(port)
    if isinstance(text, OSError):
        return type(text).__name__
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:tokens_predicted_total"))
    return float(line.split()[-1])


def kill_one_instance() -> None:
    """Instance 2's llama-server SIGKILLed: the set is degraded, then ready again with no
    action by anyone (systemd's restart, the balancer's check)."""
    pid_before = show(SET_UNITS[2], "MainPID")["MainPID"]
    run("systemctl", "kill", "--signal=SIGKILL", SET_UNITS[2], timeout=60, check="set_kill")
    killed = time.monotonic()
    came_back = wait_until(
        "the killed instance is back",
        lambda: (
            show(SET_UNITS[2], "MainPID")["MainPID"] not in {"0", pid_before}
            and endpoint_state(SET) == "ready"
        ),
        300,
        every=1,
    )
    record(
        "set_after_kill",
        came_back=came_back,
        seconds=round(time.monotonic() - killed, 1),
        pid_before=pid_before,
        pid_after=show(SET_UNITS[2], "MainPID")["MainPID"],
        restarts=show(SET_UNITS[2], "NRestarts")["NRestarts"],
    )


def server_processes(check: str) -> None:
    """Every llama-server of the set."""
    found = run("pgrep", "-x", "llama-server")["stdout"].split()
    record(check, servers=[server_facts(pid) for pid in found])


def phase_set() -> None:
    wait_for_daemon("boot_timeline")
    must("remove", "epycctl", "remove", NAME, "--yes", timeout=300)
    ENDPOINT_FILE.unlink()
    debs = sorted(str(p) for p in Path("/haproxy-debs").glob("*.deb"))
    must("haproxy", "dpkg", "-i", *debs, timeout=300)
    run("systemctl", "disable", "--now", "haproxy.service", timeout=60, check="no_default")
    Path(f"/etc/epyc-llm/{SET}.toml").write_text(
        f'engine = "llama.cpp"\nmodel = "{CONFIG["gguf"]}"\ninstances = 2\n'
        f'port = {CONFIG["set_port"]}\nserved_model_name = "{SET}"\n'
    )
    approve = run("epycctl", "approve", SET, "--yes", timeout=600, check="set_approve")
    set_units("set_units")
    if approve["rc"] != 0:
        for unit in SET_UNITS:
            journal(f"journal_{unit}", unit)
        raise PhaseFailed(f"approve failed: {approve['stderr'][-2000:]}")
    ports = member_ports()
    before = [predicted_tokens(port) for port in ports]
    url = status_url_of(SET, "set_status")
    for index in range(SET_CHATS):
        chat(f"set_chat_{index}", url, model=SET)
    record("set_served", before=before, after=[predicted_tokens(port) for port in ports])
    server_processes("set_servers")
    kill_one_instance()
    set_units("set_units_after_kill")
    epycctl_status("set_status_after_kill", SET)
    hang_instance("set_stop_instance", SET, 0)
    epycctl_status("set_status_after_stop", SET)


def phase_set_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_until(
        "the balancer settles",
        lambda: show(SET_UNITS[0], "ActiveState")["ActiveState"] in {"active", "failed"},
        600,
    )
    set_units("set_units")
    chat("set_chat", status_url_of(SET, "set_status"))


GATEWAY_CLIENT = """
import json, ssl, subprocess, sys
import httpx
url, ca, keys_file, stream_too = sys.argv[1:]
keys = json.loads(open(keys_file).read())
tls = ssl.create_default_context(cafile=ca)
def post(path, body, client=None):
    auth = {"Authorization": "Bearer " + keys[client]} if client else {}
    r = httpx.post(url + path, json=body, verify=tls, timeout=120, headers=auth)
    return r.status_code, r.json()
chat = {"model": "pair", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
emb = {"model": "emb", "input": ["a", "b"]}
out = {"chat": post("/v1/chat/completions", chat, "all")[0]}
code, body = post("/v1/embeddings", emb, "all")
vectors = body.get("data", [])
out["embeddings"] = [code, len(vectors), len(vectors[0]["embedding"]) if vectors else 0]
models = httpx.get(url + "/v1/models", verify=tls,
                   headers={"Authorization": "Bearer " + keys["all"]})
out["models"] = sorted(m["id"] for m in models.json()["data"])
out["pair_only"] = [post("/v1/chat/completions", chat, "pair-only")[0],
                    post("/v1/embeddings", emb, "pair-only")[0]]
out["no_key"] = post("/v1/embeddings", emb)[0]
out["alias"] = post("/v1/embeddings", dict(emb, model="text-embedding-3-small"), "all")[0]
if stream_too == "stream":
    out["rate"] = [post("/v1/chat/completions", chat, "two-a-minute")[0] for _ in range(3)]
    stream = dict(chat, stream=True, max_tokens=1500, ignore_eos=True)
    events, reloaded, finish = 0, None, None
    with httpx.stream("POST", url + "/v1/chat/completions", json=stream, verify=tls,
                      timeout=300, headers={"Authorization": "Bearer " + keys["all"]}) as r:
        out["stream_status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events += 1
            finish = json.loads(line[6:])["choices"][0].get("finish_reason") or finish
            if events == 1:
                done = subprocess.run(["systemctl", "reload", "epyc-llm-gateway.service"])
                reloaded = {"rc": done.returncode, "at_event": events}
    out["stream"] = {"events": events, "finish": finish, "reloaded": reloaded}
print(json.dumps(out))
"""
GATEWAY_UNIT = "epyc-llm-gateway.service"
EMB = "emb"
EMB_ALIAS = "text-embedding-3-small"
METRIC_LINES = ("haproxy_backend_http_requests_total{", "epyc_llm_gateway_", "epyc_llm_cold_start")
"""The lines of the gateway's exporter and of epycd's /metrics the test reads."""


def metric_lines(check: str, url: str) -> None:
    """The lines of `METRIC_LINES` at `url`, or why there are none."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    except OSError as exc:
        record(check, error=str(exc))
        return
    record(check, lines=[line for line in text.splitlines() if line.startswith(METRIC_LINES)])


def gateway_keys() -> Path:
    """Three clients' keys, each the last line of `add-key`'s output, kept for the client."""
    keys = {}
    for name, *limits in (("all",), ("pair-only", "--models", SET), ("two-a-minute", "--rpm", "2")):
        done = must(f"add_key_{name}", "epycctl", "gateway", "add-key", name, *limits, timeout=60)
        keys[name] = done["stdout"].strip().splitlines()[-1]
    path = Path("/root/gateway-keys.json")
    path.write_text(json.dumps(keys))
    path.chmod(0o600)
    return path


def gateway_models(keys: Path) -> list[str]:
    """The models the gateway lists now (those whose endpoint passes its health check)."""
    url = f"https://127.0.0.1:{CONFIG['gateway_port']}/v1/models"
    key = json.loads(keys.read_text())["all"]
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    tls = ssl.create_default_context(cafile=CONFIG["gateway_ca"])
    try:
        with urllib.request.urlopen(request, timeout=10, context=tls) as reply:
            return [model["id"] for model in json.loads(reply.read())["data"]]
    except OSError:
        return []


def through_gateway(check: str, keys: Path, *, stream: bool) -> None:
    url = f"https://127.0.0.1:{CONFIG['gateway_port']}"  # a bare host may not resolve localhost
    done = run(str(PREFIX / "bin" / "python"), "-c", GATEWAY_CLIENT, url, CONFIG["gateway_ca"],
               str(keys), "stream" if stream else "-", timeout=300)  # fmt: skip
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, stderr=done["stderr"][-3000:])


def phase_gateway() -> None:
    """The set of the last phase stays; the gateway goes in front of it. Then the set is
    removed and the embedder approved in its place (this 2-core machine holds one endpoint
    at a time): the gateway's routes follow, through reloads, on the same URL."""
    wait_for_daemon("boot_timeline")
    wait_until("the set is ready", lambda: endpoint_state(SET) == "ready", 600)
    conf = Path("/etc/epyc-llm/epycd.conf")
    kept = conf.read_text() if conf.exists() else ""  # the identity root, where there is one
    conf.write_text(
        kept + f'gateway_listen = "127.0.0.1:{CONFIG["gateway_port"]}"\n'
        f'gateway_metrics_listen = "127.0.0.1:{CONFIG["gateway_metrics_port"]}"\n'
        f'gateway_tls_cert_file = "{CONFIG["gateway_pem"]}"\n'
    )
    run("epycctl", "gateway", "plan", "--json", timeout=60, check="gateway_plan")
    approve = run("epycctl", "gateway", "approve", "--yes", timeout=120, check="gateway_approve")
    record("gateway_unit", **show(GATEWAY_UNIT))
    if approve["rc"] != 0 or show(GATEWAY_UNIT, "ActiveState")["ActiveState"] != "active":
        journal("journal_gateway", GATEWAY_UNIT)
        raise PhaseFailed(f"gateway approve failed: {approve['stderr'][-2000:]}")
    keys = gateway_keys()
    pid = show(GATEWAY_UNIT, "MainPID")["MainPID"]
    through_gateway("gateway_set", keys, stream=True)
    must("set_remove", "epycctl", "remove", SET, "--yes", timeout=300)
    Path(f"/etc/epyc-llm/{SET}.toml").unlink()
    Path(f"/etc/epyc-llm/{EMB}.toml").write_text(
        f'engine = "llama.cpp"\nmodel = "{CONFIG["embedder_gguf"]}"\n'
        f'port = {CONFIG["emb_port"]}\nserved_model_name = "{EMB}"\n'
        f'aliases = ["{EMB_ALIAS}"]\n'
    )
    run("epycctl", "approve", EMB, "--yes", timeout=600, check="emb_approve")
    wait_until("the embedder is ready", lambda: endpoint_state(EMB) == "ready", 300)
    # the gateway's own health check finds it up within a check or so, as a client would
    wait_until("the gateway lists the embedder", lambda: EMB in gateway_models(keys), 30)
    through_gateway("gateway_emb", keys, stream=False)
    metric_lines("gateway_exporter", f"http://127.0.0.1:{CONFIG['gateway_metrics_port']}/metrics")
    metric_lines("gateway_usage", METRICS)
    record("gateway_after", main_pid_before=pid, **show(GATEWAY_UNIT))
    journal("journal_gateway", GATEWAY_UNIT)


ON_DEMAND = ("alpha", "beta")
"""Two on-demand endpoints: alpha the tiny chat GGUF, beta the tiny BERT embedder. This
one-node machine has one seat, so they share its swap seat, one running at a time."""
ON_DEMAND_MODEL = {"alpha": "gguf", "beta": "embedder_gguf"}
IDLE_S = 20
ON_DEMAND_CLIENT = """
import json, ssl, sys, time
import httpx
url, model, key_file, client, ca = sys.argv[1:]
headers, verify = {}, True
if key_file != "-":
    headers = {"Authorization": "Bearer " + json.loads(open(key_file).read())[client]}
    verify = ssl.create_default_context(cafile=ca)
if model == "beta":
    path, body = "/v1/embeddings", {"model": model, "input": ["hi", "there"]}
else:
    path = "/v1/chat/completions"
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
started = time.monotonic()
r = httpx.post(url + path, json=body, verify=verify, timeout=300, headers=headers)
out = {"status": r.status_code, "seconds": round(time.monotonic() - started, 3)}
out["model"] = r.json().get("model") if r.status_code == 200 else r.text[:500]
out["vectors"] = len(r.json().get("data", [])) if r.status_code == 200 and model == "beta" else 0
print(json.dumps(out))
"""


def engine_unit(name: str) -> str:
    return f"epyc-llm-{name}.service"


def on_demand_unit_names(name: str) -> tuple[str, str, str]:
    return f"epyc-llm-{name}.socket", f"epyc-llm-{name}_proxy.service", engine_unit(name)


ENGINE_STARTS = (
    "InactiveExitTimestampMonotonic",
    "ActiveEnterTimestampMonotonic",
    "ActiveEnterTimestamp",
    "NRestarts",
)
"""An engine unit's record of its starts since systemd loaded it: 0, 0, empty and 0 for
one that no start ever reached (one that failed while activating left inactive, too)."""


def on_demand_units(check: str) -> None:
    """Each on-demand endpoint's socket, proxy and engine as systemd has them (the engine's
    starts too: `ENGINE_STARTS`), and the llama-servers running."""
    units = {}
    for name in ON_DEMAND:
        for unit in (
            f"epyc-llm-{name}.socket",
            f"epyc-llm-{name}_proxy.service",
            engine_unit(name),
        ):
            starts = ENGINE_STARTS if unit == engine_unit(name) else ()
            units[unit] = show(unit, "ActiveState", "SubState", "Result", "UnitFileState", *starts)
    servers = run("pgrep", "-x", "llama-server")["stdout"].split()
    record(check, units=units, servers=len(servers))


def daemon_has_taken_in(names: tuple[str, ...]) -> bool:
    """epycd's status file lists each of `names` as approved: its load after the approvals
    (the plan, the status and the start of what is approved and not running) is done."""
    data = read_json(Path("/run/epyc-llm/status.json")) or {}
    states = {entry.get("name"): entry.get("state") for entry in data.get("endpoints", [])}
    return all(states.get(name) not in {None, "pending-approval"} for name in names)


def on_demand_request(check: str, name: str, *, gateway: bool, client: str = "all") -> None:
    """One request to `name` (a chat to alpha, embeddings of beta): through the gateway
    with `client`'s key and its TLS, or at the endpoint's own port."""
    if gateway:
        url = f"https://127.0.0.1:{CONFIG['gateway_port']}"
        key, ca = "/root/gateway-keys.json", CONFIG["gateway_ca"]
    else:
        url, key, ca = f"http://127.0.0.1:{CONFIG['on_demand_ports'][name]}", "-", "-"
    done = run(str(PREFIX / "bin" / "python"), "-c", ON_DEMAND_CLIENT, url, name, key, client,
               ca, timeout=400)  # fmt: skip
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, stderr=done["stderr"][-3000:])
    on_demand_units(f"{check}_units")


def engines_stopped() -> bool:
    return all(show(engine_unit(n), "ActiveState")["ActiveState"] == "inactive" for n in ON_DEMAND)


def phase_on_demand() -> None:
    """The embedder removed; two on-demand endpoints approved, a chat and an embedder
    (sharing the one seat), both behind the gateway's URL: idle until a request; a key
    limited to alpha refused beta (403, nothing started); each request through the gateway
    answered and the other engine stopped; after the idle time neither runs."""
    wait_for_daemon("boot_timeline")
    must("emb_remove", "epycctl", "remove", EMB, "--yes", timeout=300)
    Path(f"/etc/epyc-llm/{EMB}.toml").unlink()
    for name in ON_DEMAND:
        Path(f"/etc/epyc-llm/{name}.toml").write_text(
            f'engine = "llama.cpp"\nmodel = "{CONFIG[ON_DEMAND_MODEL[name]]}"\n'
            f'served_model_name = "{name}"\n'
            f"port = {CONFIG['on_demand_ports'][name]}\non_demand = true\n"
            f'idle_stop = "{IDLE_S}s"\n'
        )
    for name in ON_DEMAND:
        run("epycctl", "plan", name, "--json", timeout=120, check=f"od_plan_{name}")
    for name in ON_DEMAND:
        done = run("epycctl", "approve", name, "--yes", timeout=300, check=f"od_approve_{name}")
        if done["rc"] != 0:
            raise PhaseFailed(f"approve {name} failed: {done['stderr'][-2000:]}")
    epycctl_status("od_status_approved")
    on_demand_units("od_units_approved")
    record("od_unit_files", texts={
        unit: (Path("/etc/systemd/system") / unit).read_text()
        for name in ON_DEMAND
        for unit in on_demand_unit_names(name)
    })  # fmt: skip
    wait_until("the gateway routes both", lambda: set(ON_DEMAND) <= set(gateway_models(
        Path("/root/gateway-keys.json"))), 60)  # fmt: skip
    record("od_gateway_models", models=gateway_models(Path("/root/gateway-keys.json")))
    keys = Path("/root/gateway-keys.json")
    add = must("add_key_alpha_only", "epycctl", "gateway", "add-key", "alpha-only", "--models",
               "alpha", timeout=60)  # fmt: skip
    keys.write_text(json.dumps(json.loads(keys.read_text()) | {
        "alpha-only": add["stdout"].strip().splitlines()[-1]}))  # fmt: skip
    # between the approvals and the first request nothing starts an engine: not approve,
    # not epycd taking the approvals in (it starts the socket of one not listening), not
    # status, the gateway or a scrape; the last moment before the first request
    wait_until("epycd took in both approvals", lambda: daemon_has_taken_in(ON_DEMAND), 120)
    on_demand_units("od_before_request")
    journal("journal_epycd_before_request", "epycd.service")
    on_demand_request("od_beta_refused", "beta", gateway=True, client="alpha-only")
    on_demand_request("od_alpha", "alpha", gateway=True)
    on_demand_request("od_beta", "beta", gateway=True)
    on_demand_request("od_alpha_again", "alpha", gateway=True)
    epycctl_status("od_status_serving")
    started = time.monotonic()
    stopped = wait_until("both engines stop when idle", engines_stopped, IDLE_S + 120)
    record("od_idle", stopped=stopped, seconds=round(time.monotonic() - started, 1))
    on_demand_units("od_units_idle")
    epycctl_status("od_status_idle")
    wait_until("epycd counted the cold starts", lambda: "epyc_llm_cold_starts_total" in (
        inside.epycd_metrics()[1] or ""), 30)  # fmt: skip
    metric_lines("od_metrics", METRICS)
    journal("journal_alpha", engine_unit("alpha"))


def phase_on_demand_reboot() -> None:
    """After a reboot nothing runs until a request, and the request is answered."""
    wait_for_daemon("boot_timeline")
    time.sleep(3)  # what would start at boot has had its chance
    on_demand_units("od_units_boot")
    epycctl_status("od_status_boot")
    on_demand_request("od_beta_boot", "beta", gateway=False)


PHASES = {
    "install": phase_install,
    "reboot": phase_reboot,
    "set": phase_set,
    "set_reboot": phase_set_reboot,
    "gateway": phase_gateway,
    "on_demand": phase_on_demand,
    "on_demand_reboot": phase_on_demand_reboot,
}

if __name__ == "__main__":
    inside.PHASES = PHASES
    inside.main()
