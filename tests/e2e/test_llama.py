"""README command 1 with the llama.cpp engine on a bare host, the proof that a llama.cpp
endpoint works from nothing: `packaging/install.sh --engine llama.cpp && epycctl quickstart
--engine llama.cpp --model FILE --yes` on real systemd (PID 1 in systemd-nspawn), in a fresh
copy of the bare Debian 12 of tests/tools/bare_host.sh (no venv module, no compiler, no network;
apt from a local repository, pip from a local PyPI mirror), serving a real published model (Gemma
3 270M, Q4_K_M: tests/tools/published_gemma.sh), planned from llama-server's own memory pass;
the later phases serve the tiny model converted to GGUF.

One part is given, not rebuilt: llama-server itself. The machine starts with the recipe's
finished folder in /opt/epyc-llm/llama-runtime (bin/ and its stamp), which
tests/tools/llama_server.sh built on this CPU with the same recipe (packaging/llama-runtime.sh,
from PyPI's pinned source: 13 minutes on 2 cores, too long to repeat per run); install.sh
still runs the recipe, which finds its stamp and keeps it. Four boots, each one phase of
tests/e2e/inside_llama.py:

install  install.sh --engine llama.cpp (the venv module and g++ from apt), quickstart of the
         Gemma -> ready, the hand-off, a chat, "Paris" at temperature 0, status ready;
         llama-server pinned to the socket's cores with one thread each, its memory bound
         to the socket's nodes, its weights locked
reboot   back with no new approval: status ready and a chat; llama-server killed (kill -9),
         then stopped (SIGSTOP): ready again each time with no action
set      that endpoint removed; an endpoint of two llama-servers (one per core of the 2-core
         test machine) behind Debian's HAProxy (.debs from tests/tools/haproxy.sh, installed
         with dpkg): the balancer and both instances up, chats reach both, instance 2 killed
         comes back by itself
set_reboot  the set back with no new approval: its three units, status ready, a chat
gateway  the tiny BERT embedder (GGUF) approved beside the set, then the gateway on HTTPS with
         a self-signed certificate and three keys: both models through one URL, /v1/models,
         a key limited to one model (403), one over its rate (429), and a streamed chat that a
         reload in its middle does not cut; the embedder's alias, and the gateway's metrics
on_demand  the embedder removed; two on-demand endpoints approved, the tiny chat GGUF and
         the tiny BERT embedder, which the one NUMA node cannot seat both of: they share its
         swap seat, both behind the gateway's one URL. Idle until a request; a key limited to
         the chat model refused the embedder (403); each request through the gateway answered,
         the other engine stopped; after the idle time neither runs; epycd counted the cold
         starts and the gateway's response times per client and model
on_demand_reboot  nothing runs after the boot until a request, which is answered
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epycd.host.cpulist import format_cpulist, parse_cpulist
from tests.e2e.conftest import (
    MLOCK_AS_ON_A_HOST,
    Boot,
    Machine,
    clean_copy,
    drive_with,
    endpoint,
    fresh_copy,
    kept_or_removed,
    offline_apt,
    port_free,
    require_parts,
)
from tests.e2e.faultfigures import engine_fault, healing_problem
from tests.e2e.test_instances import HAPROXY_DEBS
from tests.e2e.test_runtime import APT_REPO, BARE_ROOTFS, IDENTITY_ROOT, PYPI, journal_tail
from tests.gateway.test_real_gateway import self_signed
from tests.llama.realllama import (
    SERVER,
    llama_server,
    published_gemma,
    tiny_bert_gguf,
    tiny_gguf,
)
from tests.machine import physical_cpus_of_socket, serving_needs_identity, write_identity_root

pytestmark = pytest.mark.e2e

HINT = (
    "run tests/bootstrap.sh (tests/tools/bare_host.sh, llama_server.sh, tiny_gguf.sh and "
    "published_gemma.sh)"
)
PHASES = ("install", "reboot", "set", "set_reboot", "gateway", "on_demand", "on_demand_reboot")
NAME = "default"
MODEL_DIR = "/srv/models"
GGUF = f"{MODEL_DIR}/tiny-q8_0.gguf"
QUICKSTART_GGUF = f"{MODEL_DIR}/gemma-3-270m-q4_k_m.gguf"
RUNTIME = "/opt/epyc-llm/llama-runtime"
PORTS = range(18621, 18630)
SET = "pair"
SET_PORT = 18625
SET_UNITS = tuple(f"epyc-llm-{SET}{suffix}.service" for suffix in ("", "_1", "_2"))
EMBEDDER_GGUF = f"{MODEL_DIR}/embedder-bf16.gguf"
EMB_PORT = 18626
GATEWAY_PORT = 18628
GATEWAY_METRICS_PORT = 18629
GATEWAY_PEM = "/etc/epyc-llm/secrets/gateway.pem"
GATEWAY_CA = "/root/gateway-ca.pem"
ON_DEMAND_PORTS = {"alpha": 18626, "beta": 18627}
ON_DEMAND_IDLE_S = 20


def machine_config() -> dict[str, Any]:
    """What inside_llama.py reads from /results/config.json (and inside.py's helpers)."""
    return {
        "name": NAME,
        "never": "never",
        "port": 0,
        "served": "",
        "client_python": "",
        "model_dir": MODEL_DIR,
        "gguf": GGUF,
        "quickstart_gguf": QUICKSTART_GGUF,
        "pypi": "/var/cache/e2e-pypi",
        "identity_root": IDENTITY_ROOT if serving_needs_identity() else None,
        "set_name": SET,
        "set_port": SET_PORT,
        "embedder_gguf": EMBEDDER_GGUF,
        "emb_port": EMB_PORT,
        "gateway_port": GATEWAY_PORT,
        "gateway_metrics_port": GATEWAY_METRICS_PORT,
        "gateway_pem": GATEWAY_PEM,
        "gateway_ca": GATEWAY_CA,
        "on_demand_ports": ON_DEMAND_PORTS,
    }


def write_machine(root: Path, config: dict[str, Any]) -> None:
    drive_with(root, "inside_llama.py")
    models = root / MODEL_DIR.lstrip("/")
    models.mkdir(parents=True)
    shutil.copy2(tiny_gguf("q8_0"), root / GGUF.lstrip("/"))
    shutil.copy2(published_gemma(), root / QUICKSTART_GGUF.lstrip("/"))
    shutil.copy2(tiny_bert_gguf("embedder"), root / EMBEDDER_GGUF.lstrip("/"))
    pem, cert = self_signed(root / "root")
    secrets = root / GATEWAY_PEM.lstrip("/")
    secrets.parent.mkdir(parents=True, mode=0o755)
    pem.rename(secrets)
    secrets.chmod(0o600)
    cert.rename(root / GATEWAY_CA.lstrip("/"))
    for leftover in (root / "root").glob("key.pem"):
        leftover.unlink()
    runtime = root / RUNTIME.lstrip("/")
    runtime.mkdir(parents=True)
    shutil.copytree(SERVER / "bin", runtime / "bin")
    shutil.copy2(SERVER / ".epyc-stamp", runtime / ".epyc-stamp")
    offline_apt(root)
    if config["identity_root"]:
        write_identity_root(root / IDENTITY_ROOT.lstrip("/"))


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    require_parts(BARE_ROOTFS, APT_REPO, PYPI, hint=HINT)
    if not sorted(HAPROXY_DEBS.glob("haproxy_*.deb")):
        pytest.fail(f"no HAProxy .debs in {HAPROXY_DEBS}: run tests/bootstrap.sh")
    llama_server()
    published_gemma()
    busy = [port for port in PORTS if not port_free(port)]
    assert not busy, f"ports {busy} are in use on this machine"
    work = tmp_path_factory.mktemp("e2e-llama")
    root, results = fresh_copy(BARE_ROOTFS, work)
    src = work / "src"
    clean_copy(src)
    config = machine_config()
    write_machine(root, config)
    (results / "config.json").write_text(json.dumps(config, indent=2))
    binds = [
        "--private-network",
        *MLOCK_AS_ON_A_HOST,
        f"--bind-ro={src}:/src",
        f"--bind={results}:/results",
        f"--bind-ro={APT_REPO}:/var/cache/e2e-apt",
        f"--bind-ro={PYPI}:/var/cache/e2e-pypi",
        f"--bind-ro={HAPROXY_DEBS}:/haproxy-debs",
    ]
    with kept_or_removed(work):
        yield Machine(root, results, binds, phases=PHASES)


@pytest.fixture(scope="module")
def install(machine: Machine) -> Boot:
    return machine.boot("install")


def expected_cpus() -> list[int]:
    """The socket's physical cores, as this machine's topology (or its identity root) has
    them: the plan's set and llama-server's thread count."""
    return physical_cpus_of_socket(0)


def test_install_brings_the_build_prerequisites_and_keeps_the_built_server(install: Boot) -> None:
    assert install.one("pid1")["comm"] == "systemd"
    fresh = install.one("fresh")
    assert not fresh["ensurepip"] and not fresh["found"]["g++"], f"not a bare host: {fresh}"
    assert fresh["pypi_resolves"] is False, "the machine reaches the network"
    done = install.one("install")
    assert done["rc"] == 0, done["stdout"][-2000:] + done["stderr"][-3000:]
    out = done["stdout"]
    assert "apt: installing python3.11-venv g++" in out, out[-3000:]
    assert f"llama-runtime: {RUNTIME} is provisioned" in out, out[-3000:]
    assert "next: epycctl quickstart --engine llama.cpp" in out, out[-3000:]


def test_readme_command_one_with_llama_cpp_serves_a_published_model(install: Boot) -> None:
    """quickstart of Gemma 3 270M, an architecture the measured formulas do not cover: planned
    from llama-server's own pass, ready, and right at temperature 0."""
    done = install.one("quickstart")
    assert done["rc"] == 0, done["stdout"][-3000:] + done["stderr"][-3000:] + journal_tail(install)
    out = done["stdout"]
    assert "runtime: host (llama.cpp" in out and "Plan for endpoint default" in out, out[-3000:]
    assert f"{NAME} is ready." in out, out[-3000:]
    written = install.one("endpoint_file")["text"]
    assert 'engine = "llama.cpp"' in written and f'model = "{QUICKSTART_GGUF}"' in written, written
    unit = install.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(install.one("status")["status"], NAME)["state"] == "ready"
    chat = install.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] == 1 and chat["reply"]["completion_tokens"] > 0, chat
    completion = install.one("completion")
    assert completion["rc"] == 0, completion["stderr"]
    assert "Paris" in completion["reply"]["text"], completion
    timing = install.one("timing")
    print(
        f"\ne2e-llama: bare rootfs to ready {timing['fresh_to_ready_s']} s (install.sh --engine "
        f"llama.cpp {timing['install_s']} s, quickstart {timing['quickstart_s']} s); "
        f"boot {install.seconds} s"
    )


def test_llama_server_is_pinned_bound_and_locked(install: Boot) -> None:
    """Its unit asks for its weights locked (the lock itself: the set's tiny model, below)."""
    server = install.one("server")
    assert server["pid"] is not None, journal_tail(install)
    cores = expected_cpus()
    argv = server["argv"]
    assert argv[0] == f"{RUNTIME}/bin/llama-server", argv
    assert argv[argv.index("--threads") + 1] == str(len(cores)), argv
    assert argv[argv.index("--threads-batch") + 1] == str(len(cores)), argv
    assert parse_cpulist(server["cpus"]) == cores, server
    assert server["numa_policy"].split()[1].startswith("bind:"), server["numa_policy"]
    assert server["uid"] != "0", "llama-server runs as root"
    assert "mmap+mlock" in argv and install.one("memlock")["LimitMEMLOCK"] == "infinity", server
    text = install.one("unit_file")["text"]
    assert f"\nCPUAffinity={format_cpulist(cores)}\n" in text, text
    bound = server["numa_policy"].split()[1].removeprefix("bind:")
    assert f"\nNUMAPolicy=bind\nNUMAMask={bound}\n" in text, text


def test_reboot_brings_it_back_ready(machine: Machine, install: Boot) -> None:
    install.assert_clean()
    reboot = machine.boot("reboot")
    reboot.assert_clean()
    unit = reboot.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    assert endpoint(reboot.one("status")["status"], NAME)["state"] == "ready"
    chat = reboot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] == 1, chat
    assert reboot.one("server")["pid"] is not None


@pytest.mark.parametrize("check", ["kill_server", "stop_server"])
def test_a_dead_or_hung_llama_server_is_back_with_no_action(machine: Machine, check: str) -> None:
    """kill -9 of llama-server: the supervisor exits by the same signal and systemd restarts
    the unit; SIGSTOP: its /health stops answering, the supervisor stops its WATCHDOG=1
    pings and systemd's watchdog kills and restarts it. Nothing counted before the faults."""
    reboot = machine.boot("reboot")
    before = reboot.one("crash_record_before_faults")["record"]
    assert before is None or before["failures"] == [], before
    fault = reboot.one(check)
    assert fault["victims"] and fault["roles"] == ["llama-server"], fault
    figures = engine_fault(fault)
    assert healing_problem(figures, hung=check == "stop_server") is None, (figures, fault)
    assert fault["crash_record"]["failures"][-1]["result"] == (
        "watchdog" if check == "stop_server" else "signal"
    ), fault["crash_record"]
    assert endpoint(reboot.one(f"{check}_status")["status"], NAME)["state"] == "ready"
    assert reboot.one(f"{check}_chat")["rc"] == 0


@pytest.fixture(scope="module")
def set_install(machine: Machine) -> Boot:
    return machine.boot("set")


def set_journals(boot: Boot) -> str:
    """The last lines of each unit of the set, as recorded when its approval failed."""
    tails = []
    for unit in SET_UNITS:
        entries = boot.all(f"journal_{unit}")[-1]["entries"] if boot.all(f"journal_{unit}") else []
        tails.append(f"{unit}:\n" + "\n".join(str(e["message"]) for e in entries[-10:]))
    return "\n".join(tails)


def _states(boot: Boot, check: str) -> dict[str, str]:
    return {unit: props["ActiveState"] for unit, props in boot.one(check)["units"].items()}


def test_a_set_of_two_llama_servers_behind_haproxy_comes_up_pinned_apart(
    set_install: Boot,
) -> None:
    approve = set_install.one("set_approve")
    assert approve["rc"] == 0, approve["stderr"][-3000:] + set_journals(set_install)
    assert _states(set_install, "set_units") == dict.fromkeys(SET_UNITS, "active")
    pair = endpoint(set_install.one("set_status")["status"], SET)
    assert pair["state"] == "ready", pair
    assert [i["state"] for i in pair["instances"]] == ["ready", "ready"], pair
    servers = set_install.one("set_servers")["servers"]
    assert len(servers) == 2, servers
    cpus = [set(parse_cpulist(s["cpus"])) for s in servers]
    assert all(cpus) and not cpus[0] & cpus[1], cpus
    for server, its_cpus in zip(servers, cpus, strict=True):
        # the tiny model's weights fit the machine's locked-memory limit (MLOCK_AS_ON_A_HOST)
        assert server["locked_kib"] > 0, f"weights not locked (--load-mode mmap+mlock): {server}"
        argv = server["argv"]
        assert argv[argv.index("--threads") + 1] == str(len(its_cpus)), argv


def test_chats_through_the_balancer_reach_both_llama_servers(set_install: Boot) -> None:
    chats = [set_install.one(f"set_chat_{i}") for i in range(6)]
    assert all(c["rc"] == 0 and c["reply"]["completion_tokens"] > 0 for c in chats), chats
    assert chats[0]["url"] == f"http://127.0.0.1:{SET_PORT}/v1", chats[0]
    served = set_install.one("set_served")
    assert all(isinstance(n, float) for n in served["before"] + served["after"]), served
    grew = [after - before for before, after in zip(served["before"], served["after"], strict=True)]
    assert min(grew) > 0, f"an instance served nothing: generated tokens grew by {grew}"


def test_a_killed_llama_server_comes_back_by_itself(set_install: Boot) -> None:
    after = set_install.one("set_after_kill")
    assert after["came_back"], after
    assert after["pid_after"] != after["pid_before"] and int(after["restarts"]) >= 1, after
    assert _states(set_install, "set_units_after_kill") == dict.fromkeys(SET_UNITS, "active")
    pair = endpoint(set_install.one("set_status_after_kill")["status"], SET)
    assert pair["state"] == "ready", pair
    set_install.assert_clean()


def test_a_hung_llama_server_of_the_set_comes_back_by_itself(set_install: Boot) -> None:
    """Instance 1's llama-server stopped (SIGSTOP): systemd's watchdog kills that instance
    alone and it is back, the set ready again, with no action."""
    fault = set_install.one("set_stop_instance")
    assert fault["victims"], fault
    assert healing_problem(engine_fault(fault), hung=True) is None, fault
    pair = endpoint(set_install.one("set_status_after_stop")["status"], SET)
    assert pair["state"] == "ready", pair


def test_reboot_brings_the_llama_set_back(machine: Machine, set_install: Boot) -> None:
    reboot = machine.boot("set_reboot")
    reboot.assert_clean()
    assert _states(reboot, "set_units") == dict.fromkeys(SET_UNITS, "active")
    assert endpoint(reboot.one("set_status")["status"], SET)["state"] == "ready"
    chat = reboot.one("set_chat")
    assert chat["rc"] == 0 and chat["reply"]["choices"] == 1, chat


@pytest.fixture(scope="module")
def gateway(machine: Machine, set_install: Boot) -> Boot:
    return machine.boot("gateway")


def test_one_gateway_url_with_keys_limits_and_tls_in_front_of_the_set(gateway: Boot) -> None:
    approve = gateway.one("gateway_approve")
    assert approve["rc"] == 0, approve["stderr"][-3000:]
    unit = gateway.one("gateway_unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit
    client = gateway.one("gateway_set")
    assert client["rc"] == 0, client["stderr"]
    reply = client["reply"]
    assert reply["chat"] == 200 and reply["models"] == [SET], reply
    assert reply["embeddings"][0] == 404, reply  # no embedder yet
    assert reply["pair_only"] == [200, 404], reply
    assert reply["no_key"] == 401, reply
    assert reply["alias"] == 404, reply  # no embedder, so no alias of it yet
    assert reply["rate"] == [200, 200, 429], reply


def test_a_reload_in_the_middle_of_a_stream_does_not_cut_it(gateway: Boot) -> None:
    stream = gateway.one("gateway_set")["reply"]["stream"]
    assert stream["reloaded"] == {"rc": 0, "at_event": 1}, stream
    assert stream["finish"] == "length" and stream["events"] >= 1000, stream


def test_the_routes_follow_the_endpoints_on_the_same_url(gateway: Boot) -> None:
    """The set removed and the embedder approved: its vectors through the gateway, the
    set's model gone (404), a key limited to the set refused the embedder (403), and the
    gateway reloaded for each change, never restarted."""
    assert gateway.one("emb_approve")["rc"] == 0, gateway.one("emb_approve")["stderr"][-3000:]
    client = gateway.one("gateway_emb")
    assert client["rc"] == 0, client["stderr"]
    reply = client["reply"]
    assert reply["embeddings"][:2] == [200, 2] and reply["embeddings"][2] > 0, reply
    assert reply["models"] == ["emb", "text-embedding-3-small"], reply  # the alias too
    assert reply["chat"] == 404, reply
    assert reply["pair_only"] == [404, 403], reply
    assert reply["alias"] == 200, reply  # the endpoint file's alias, routed to it
    after = gateway.one("gateway_after")
    assert after["ActiveState"] == "active", after
    assert after["MainPID"] == after["main_pid_before"], "the gateway restarted, not reloaded"
    gateway.assert_clean()


def samples(lines: list[str]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = "\n".join(lines) + "\n"
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_gateways_metrics_count_each_endpoint_and_each_clients_use(gateway: Boot) -> None:
    """After the embedder's approval (a reload, which starts the counts again): HAProxy's
    exporter has the embedder's backend, and epycd's /metrics each client's use of it, the
    alias counted as the model it stands for and the 403 as a client error."""
    exporter = gateway.one("gateway_exporter")
    requests = samples(exporter.get("lines", []))
    backend = frozenset({("proxy", "endpoint-emb")})
    emb = requests.get(("haproxy_backend_http_requests_total", backend))
    assert emb is not None and emb >= 2, exporter
    usage = gateway.one("gateway_usage")
    found = samples(usage.get("lines", []))
    assert found[("epyc_llm_gateway_up", frozenset())] == 1, usage

    def pair(name: str, client: str) -> float:
        labels = frozenset({("client", client), ("model", "emb")})
        return found[(f"epyc_llm_gateway_{name}_total", labels)]

    assert [pair(n, "all") for n in ("requests", "client_errors", "server_errors")] == [2, 0, 0]
    assert [pair(n, "pair-only") for n in ("requests", "client_errors")] == [1, 1]


@pytest.fixture(scope="module")
def on_demand(machine: Machine, gateway: Boot) -> Boot:
    return machine.boot("on_demand")


def engines_running(units: dict[str, Any]) -> dict[str, str]:
    return {
        name: units["units"][f"epyc-llm-{name}.service"]["ActiveState"] for name in ON_DEMAND_PORTS
    }


NEVER_STARTED = {
    "InactiveExitTimestampMonotonic": "0",
    "ActiveEnterTimestampMonotonic": "0",
    "NRestarts": "0",
}
"""An engine unit that no start reached since systemd loaded it (inside_llama.ENGINE_STARTS):
a start that failed while activating left inactive too. Its `ActiveEnterTimestamp` is unset,
which `systemctl show -p` prints empty, "n/a" or not at all (by systemd's version)."""


def engines_started(units: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each on-demand engine unit whose record shows a start, with that record."""
    found = {}
    for name in ON_DEMAND_PORTS:
        unit = units["units"][f"epyc-llm-{name}.service"]
        counts = {key: unit.get(key) for key in NEVER_STARTED}
        if counts != NEVER_STARTED or unit.get("ActiveEnterTimestamp") not in {None, "", "n/a"}:
            found[name] = unit
    return found


def test_two_on_demand_endpoints_share_the_node_one_running_at_a_time(on_demand: Boot) -> None:
    """A chat endpoint and an embedder, approved, both idle with nothing running and both
    behind the gateway's one URL; a key limited to the chat model is refused the embedder
    (403) and starts nothing; a request to each through the gateway is answered, and the
    other's engine is stopped by it (their units conflict)."""
    for name in ON_DEMAND_PORTS:
        planned = json.loads(on_demand.one(f"od_plan_{name}")["stdout"])
        assert planned["on_demand"]["swap_group"] == sorted(ON_DEMAND_PORTS), planned
        assert planned["port"] == ON_DEMAND_PORTS[name], planned
        assert on_demand.one(f"od_approve_{name}")["rc"] == 0, on_demand.one(f"od_approve_{name}")
    approved = on_demand.one("od_units_approved")
    assert approved["servers"] == 0, approved
    # from the approvals to the first request (epycd took both in) no engine ran or started
    for check in ("od_units_approved", "od_before_request"):
        quiet = on_demand.one(check)
        assert quiet["servers"] == 0, (check, quiet)
        assert engines_started(quiet) == {}, (check, on_demand.all("journal_epycd_before_request"))
    for name in ON_DEMAND_PORTS:
        assert approved["units"][f"epyc-llm-{name}.socket"]["ActiveState"] == "active", approved
        assert endpoint(on_demand.one("od_status_approved")["status"], name)["state"] == "idle"
    # both behind the gateway's one URL at once, listed though neither runs
    assert set(ON_DEMAND_PORTS) <= set(on_demand.one("od_gateway_models")["models"])
    texts = on_demand.one("od_unit_files")["texts"]
    assert "Conflicts=epyc-llm-beta.service" in texts["epyc-llm-alpha.service"], texts
    assert "StopWhenUnneeded=yes" in texts["epyc-llm-beta.service"], texts
    assert "[Install]" not in texts["epyc-llm-beta.service"], texts
    refused = on_demand.one("od_beta_refused")
    assert refused["rc"] == 0 and refused["reply"]["status"] == 403, refused
    assert engines_running(on_demand.one("od_beta_refused_units")) == {
        "alpha": "inactive",
        "beta": "inactive",
    }, "a refused request started an engine"
    for check, name, other in (
        ("od_alpha", "alpha", "beta"),
        ("od_beta", "beta", "alpha"),
        ("od_alpha_again", "alpha", "beta"),
    ):
        done = on_demand.one(check)
        assert done["rc"] == 0 and done["reply"]["status"] == 200, done
        if name == "beta":
            assert done["reply"]["vectors"] == 2, done  # the embedder's two vectors
        else:
            assert done["reply"]["model"] == name, done
        running = engines_running(on_demand.one(f"{check}_units"))
        assert running == {name: "active", other: "inactive"}, (check, running)
        print(f"\ne2e-llama on demand: {check} answered in {done['reply']['seconds']} s (cold)")


def test_after_the_idle_time_neither_engine_runs(on_demand: Boot) -> None:
    idle = on_demand.one("od_idle")
    assert idle["stopped"], idle
    units = on_demand.one("od_units_idle")
    assert units["servers"] == 0, units
    for name in ON_DEMAND_PORTS:
        assert units["units"][f"epyc-llm-{name}.service"]["Result"] == "success", units
        assert units["units"][f"epyc-llm-{name}.socket"]["ActiveState"] == "active", units
        status = endpoint(on_demand.one("od_status_idle")["status"], name)
        assert status["state"] == "idle" and status["restarts"] == 0, status
    assert idle["seconds"] < ON_DEMAND_IDLE_S + 60, idle


def test_epycd_counts_the_cold_starts(on_demand: Boot) -> None:
    """alpha started twice (the second time after beta stopped it), beta once; and the
    gateway's response time per client and model."""
    lines = on_demand.one("od_metrics").get("lines", [])
    found = samples(lines)
    starts = {
        name: found.get(("epyc_llm_cold_starts_total", frozenset({("endpoint", name)})))
        for name in ON_DEMAND_PORTS
    }
    assert starts == {"alpha": 2, "beta": 1}, lines
    seconds = found[("epyc_llm_cold_start_seconds_total", frozenset({("endpoint", "alpha")}))]
    assert 0 < seconds < 120, lines
    # the gateway's time per client and model: alpha's two answers, beta's one, none for
    # the refusal (the approvals reloaded the gateway before these requests)

    def answers(client: str, model: str) -> float | None:
        labels = frozenset({("client", client), ("model", model)})
        return found.get(("epyc_llm_gateway_response_seconds_count", labels))

    assert [answers("all", "alpha"), answers("all", "beta")] == [2, 1], lines
    assert answers("alpha-only", "beta") == 0, lines
    total = found[
        ("epyc_llm_gateway_response_seconds_sum", frozenset({("client", "all"), ("model", "beta")}))
    ]
    assert 0 < total < 120, lines
    on_demand.assert_clean()


@pytest.fixture(scope="module")
def on_demand_reboot(machine: Machine, on_demand: Boot) -> Boot:
    return machine.boot("on_demand_reboot")


def test_after_a_reboot_nothing_runs_until_a_request(on_demand_reboot: Boot) -> None:
    units = on_demand_reboot.one("od_units_boot")
    assert units["servers"] == 0, units
    assert engines_started(units) == {}, units  # nor started and gone again
    assert set(engines_running(units).values()) == {"inactive"}, units
    for name in ON_DEMAND_PORTS:
        assert units["units"][f"epyc-llm-{name}.socket"]["ActiveState"] == "active", units
        assert endpoint(on_demand_reboot.one("od_status_boot")["status"], name)["state"] == "idle"
    done = on_demand_reboot.one("od_beta_boot")
    assert done["rc"] == 0 and done["reply"]["status"] == 200, done
    assert engines_running(on_demand_reboot.one("od_beta_boot_units")) == {
        "alpha": "inactive",
        "beta": "active",
    }
    on_demand_reboot.assert_clean()
