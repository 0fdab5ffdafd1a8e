"""The admin's side of the end-to-end test, run inside the booted container by a oneshot unit.

Standard library only: it runs under the container's own /usr/bin/python3 before the
product is installed. Each boot runs one phase, named by `/results/phase`; every
observation is one JSON line in `/results/PHASE.jsonl` (`{"check": ..., ...}`) for the
pytest side to assert on. At the end (or on any error, recorded as `"check": "error"`) it
writes `{"check": "done"}` and powers the container off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path("/results")
CONFIG = json.loads((RESULTS / "config.json").read_text())
PHASE = (RESULTS / "phase").read_text().strip()
OUT = RESULTS / f"{PHASE}.jsonl"
NAME: str = CONFIG["name"]
NEVER: str = CONFIG["never"]
UNIT = f"epyc-llm-{NAME}.service"
ENDPOINT_FILE = Path("/etc/epyc-llm") / f"{NAME}.toml"
DAEMON_CONF = Path("/etc/epyc-llm/epycd.conf")
UNIT_FILE = Path("/etc/systemd/system") / UNIT
APPROVAL = Path("/var/lib/epyc-llm/approvals") / f"{NAME}.json"
SUPERVISOR_STATUS = Path("/run/epyc-llm/endpoints") / NAME / "status.json"
CRASH_RECORD = Path("/var/lib/epyc-llm/crashloop") / f"epyc-llm-{NAME}.json"
PRODUCT_USER = "epyc-llm"
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
    "PIP_CACHE_DIR": "/var/cache/e2e-pip",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "SYSTEMD_PAGER": "",
}
METRICS = "http://127.0.0.1:9464/metrics"
"""epycd's /metrics at its default metrics_listen."""
PROMETHEUS = Path("/opt/prometheus")
"""Debian's prometheus and promtool (tests/tools/prometheus.sh), bound read-only."""
T0 = time.monotonic()
FAULT_TIMEOUT_S = 400
CRASH_LOOP_QUIET_S = 20
"""How long nothing may start after a crash-loop verdict (RestartSec= is 5 s)."""


def record(check: str, **data: Any) -> None:
    line = json.dumps({"check": check, "t": round(time.monotonic() - T0, 2), **data})
    with OUT.open("a") as out:
        out.write(line + "\n")
    print(line[:2000], flush=True)


def run(*argv: str, timeout: float = 120, check: str | None = None) -> dict[str, Any]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=ENV, check=False
        )
        result = {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    except subprocess.TimeoutExpired as exc:
        result = {"rc": None, "stdout": str(exc.stdout), "stderr": f"timeout after {timeout}s"}
    result["seconds"] = round(time.monotonic() - started, 2)
    if check:
        record(check, argv=list(argv), **result)
    return result


def show(unit: str, *props: str) -> dict[str, str]:
    props = props or ("LoadState", "ActiveState", "SubState", "StatusText", "MainPID", "Type")
    out = run("systemctl", "show", "-p", ",".join(props), unit)["stdout"]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def health(port: int) -> int | str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError as exc:
        return type(exc).__name__


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_until(what: str, ready: Callable[[], bool], timeout: float, every: float = 1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(every)
    record("timeout", what=what, seconds=timeout)
    return False


class Timeline:
    """Samples the units' states, the supervisor's status file and /health in a thread."""

    def __init__(self, check: str, units: tuple[str, ...], every: float = 0.5) -> None:
        self.check, self.units, self.every = check, units, every
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def sample(self) -> dict[str, Any]:
        item: dict[str, Any] = {"t": round(time.monotonic() - T0, 2)}
        for unit in self.units:
            item[unit] = show(unit, "LoadState", "ActiveState", "SubState", "StatusText")
        item["health"] = health(CONFIG["port"])
        status = read_json(SUPERVISOR_STATUS)
        item["status_file"] = status
        return item

    def loop(self) -> None:
        while not self.halt.is_set():
            self.samples.append(self.sample())
            self.halt.wait(self.every)

    def __enter__(self) -> Timeline:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.halt.set()
        self.thread.join()
        self.samples.append(self.sample())
        record(self.check, samples=self.samples)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_facts(pid: int) -> dict[str, Any]:
    base = Path("/proc") / str(pid)
    try:
        status = dict(
            line.split(":\t", 1)
            for line in (base / "status").read_text().splitlines()
            if ":\t" in line
        )
        cmdline = (base / "cmdline").read_bytes().split(b"\0")
        policies = sorted(
            {line.split()[1] for line in (base / "numa_maps").read_text().splitlines() if line}
        )
        threads = sorted(
            {
                line.split(":\t", 1)[1].strip()
                for task in (base / "task").iterdir()
                for line in (task / "status").read_text().splitlines()
                if line.startswith("Cpus_allowed_list:")
            }
        )
    except OSError:
        return {"pid": pid, "gone": True}
    return {
        "threads_cpus": threads,
        "pid": pid,
        "uid": status.get("Uid", "").split(),
        "gid": status.get("Gid", "").split(),
        "cmdline": [part.decode(errors="replace") for part in cmdline if part][:6],
        "Cpus_allowed_list": status.get("Cpus_allowed_list", "").strip(),
        "Mems_allowed_list": status.get("Mems_allowed_list", "").strip(),
        "numa_policies": policies,
    }


def record_processes() -> list[int]:
    main_pid = int(show(UNIT, "MainPID")["MainPID"] or 0)
    pids = [main_pid, *descendants(main_pid)] if main_pid else []
    record("processes", main_pid=main_pid, processes=[process_facts(pid) for pid in pids])
    return pids


CHAT = """
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="none", timeout=60, max_retries=0)
reply = client.chat.completions.create(
    model=sys.argv[2], messages=[{"role": "user", "content": "Say hello"}],
    temperature=0, max_tokens=8,
)
print(json.dumps({"choices": len(reply.choices), "content": reply.choices[0].message.content,
                  "model": reply.model, "finish_reason": reply.choices[0].finish_reason}))
"""


def chat(check: str) -> None:
    url = f"http://127.0.0.1:{CONFIG['port']}/v1"
    done = run(CONFIG["client_python"], "-c", CHAT, url, CONFIG["served"], timeout=120)
    reply = None
    if done["rc"] == 0:
        reply = json.loads(done["stdout"].strip().splitlines()[-1])
    record(check, rc=done["rc"], reply=reply, stderr=done["stderr"][-3000:])


def epycctl_status(check: str, *names: str) -> Any:
    done = run("epycctl", "status", *names, "--json", timeout=180)
    data = json.loads(done["stdout"]) if done["rc"] == 0 and done["stdout"].strip() else None
    record(check, rc=done["rc"], status=data, stderr=done["stderr"][-3000:])
    return data


def endpoint_entry(data: Any, name: str) -> dict[str, Any]:
    """The endpoint's object in `epycctl status --json` output, or {}."""
    entries = data.get("endpoints", [data]) if isinstance(data, dict) else data or []
    return next((entry for entry in entries if entry.get("name") == name), {})


def endpoint_state(name: str) -> str | None:
    done = run("epycctl", "status", name, "--json", timeout=180)
    try:
        data = json.loads(done["stdout"])
    except ValueError:
        return None
    state = endpoint_entry(data, name).get("state")
    return None if state is None else str(state)


def files_state(check: str) -> None:
    record(
        check,
        unit_sha=sha256(UNIT_FILE),
        approval_sha=sha256(APPROVAL),
        unit_enabled=run("systemctl", "is-enabled", UNIT)["stdout"].strip(),
        never_units=sorted(str(p) for p in Path("/etc/systemd/system").glob(f"epyc-llm-{NEVER}*")),
        never_unit=show(f"epyc-llm-{NEVER}.service", "LoadState", "ActiveState"),
        approvals=sorted(p.name for p in APPROVAL.parent.glob("*.json")),
    )


def journal(check: str, unit: str) -> None:
    out = run("journalctl", "-b", "-u", unit, "-o", "json", "--no-pager", timeout=60)["stdout"]
    entries = []
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, list):
            message = bytes(message).decode(errors="replace")
        entries.append(
            {
                "pid": entry.get("_PID"),
                "comm": entry.get("_COMM"),
                "identifier": entry.get("SYSLOG_IDENTIFIER"),
                "message": message,
            }
        )
    record(check, unit=unit, entries=entries)


EVENT_FIELDS = (
    "ENDPOINT",
    "INSTANCE",
    "STATE",
    "REASON",
    "SYSLOG_IDENTIFIER",
    "MESSAGE",
    "PRIORITY",
)
EVENTS_WAIT_S = 90


def event_entries(message_id: str) -> list[dict[str, Any]]:
    """This boot's journal entries with MESSAGE_ID=message_id, their fields of interest."""
    argv = ("journalctl", "-b", "-o", "json", "--no-pager", f"MESSAGE_ID={message_id}")
    entries = []
    for line in run(*argv, timeout=60)["stdout"].splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        fields = {}
        for key in EVENT_FIELDS:
            value = entry.get(key)
            if isinstance(value, list):
                value = bytes(value).decode(errors="replace")
            if value is not None:
                fields[key] = value
        entries.append(fields)
    return entries


def journal_events(check: str, *expect: str) -> None:
    """Each journal event's entries of this boot (epycd.events; the ids come from the
    config, written from the product's table), after waiting (bounded, and not a "timeout"
    record: the test says what is missing) for the `expect`ed events to appear for NAME."""
    ids: dict[str, str] = CONFIG.get("message_ids", {})
    deadline = time.monotonic() + EVENTS_WAIT_S
    while True:
        found = {event: event_entries(message_id) for event, message_id in ids.items()}
        missing = [
            event
            for event in expect
            if not any(e.get("ENDPOINT") == NAME for e in found.get(event, []))
        ]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(3)
    record(check, events=found, expected=list(expect), missing=missing)


def node_memory(check: str) -> None:
    """The NUMA nodes' meminfo: vLLM checks its KV space against a node's available memory."""
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    record(check, nodes={n.name: (n / "meminfo").read_text() for n in nodes})


def serving_evidence() -> None:
    """What the unit logged and the memory it met: the cause when it did not serve."""
    journal("journal_serving", UNIT)
    node_memory("node_memory")


def wait_for_daemon(check: str, timeout: float = 600) -> None:
    """Sample epycd and the endpoint from early boot until epycd has left `activating`."""
    with Timeline(check, ("epycd.service", UNIT)) as timeline:
        wait_until(
            "epycd.service settles",
            lambda: (
                bool(timeline.samples)
                and timeline.samples[-1]["epycd.service"]["ActiveState"] in {"active", "failed"}
            ),
            timeout,
            every=0.5,
        )
    record("epycd", **show("epycd.service"))


def supervisor_status() -> dict[str, Any]:
    return read_json(SUPERVISOR_STATUS) or {}


def engine_processes() -> list[int]:
    """The server's processes under the endpoint's supervisor: `vllm serve` and its
    children, or llama-server."""
    main_pid = int(show(UNIT, "MainPID")["MainPID"] or 0)
    return descendants(main_pid) if main_pid else []


COMM_LENGTH = 15
"""The kernel keeps a process's name (comm) to 15 characters: `VLLM::EngineCor`."""


def vllm_role(pid: int) -> str:
    """What vLLM calls its process (`VLLM::EngineCore`, `VLLM::Worker`), else its comm."""
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def named(pids: list[int], role: str) -> list[int]:
    """The processes vLLM named `VLLM::{role}`."""
    return [pid for pid in pids if vllm_role(pid) == f"VLLM::{role}"[:COMM_LENGTH]]


def signalled(sig: signal.Signals, whole_engine: bool) -> Callable[[list[int]], dict[str, Any]]:
    """`sig` to the `vllm serve` process (or every vLLM process when `whole_engine`)."""

    def act(pids: list[int]) -> dict[str, Any]:
        serve = [pid for pid in pids if process_facts(pid).get("cmdline", [])[2:3] == ["serve"]]
        victims = pids if whole_engine else serve
        for pid in victims:
            os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            metrics_while_stopped()
        return {"signal": sig.name, "victims": victims}

    return act


def killed(role: str) -> Callable[[list[int]], dict[str, Any]]:
    """kill -9 of the one vLLM process named `role` (EngineCore, Worker), as the OOM killer
    would end it."""

    def act(pids: list[int]) -> dict[str, Any]:
        victims = named(pids, role)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        return {"signal": f"SIGKILL {role}", "victims": victims}

    return act


def oom_killed(role: str) -> Callable[[list[int]], dict[str, Any]]:
    """The kernel's OOM killer ends the vLLM process named `role`: the host moves it into a
    memory cgroup whose limit is then exceeded (the machine's cgroups are read-only here)."""

    def act(pids: list[int]) -> dict[str, Any]:
        victims = named(pids, role)
        answer = ask_the_host({"action": "oom_kill", "pid": victims[0]}) if victims else {}
        return {"signal": f"OOM kill {role}", "victims": victims, "host": answer}

    return act


def ask_the_host(request: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """One request to the host's hands (tests/e2e/conftest.py HostHands), and its answer."""
    folder = RESULTS / "requests"
    name = f"{time.monotonic_ns()}"
    (folder / f"{name}.json.partial").write_text(json.dumps(request))
    (folder / f"{name}.json.partial").rename(folder / f"{name}.json")
    answer = folder / f"{name}.done"
    if not wait_until(f"the host answers {request}", answer.exists, timeout, every=0.2):
        return {"error": "the host did not answer"}
    return dict(json.loads(answer.read_text()))


def engine_fault(
    check: str,
    act: Callable[[list[int]], dict[str, Any]],
    chat_with: Callable[[str], None] | None = None,
) -> None:
    """A fault of the ready endpoint's engine (`act` on the server's processes, never the
    supervisor); then wait, doing nothing, until a new server is ready. Records the start-up
    it had, the time to ready again and what systemd and `epycctl status` say, and a chat
    (`chat_with`, default `chat`)."""
    before = supervisor_status()
    pids = engine_processes()
    roles = sorted({vllm_role(pid) for pid in pids})
    started = time.monotonic()
    done = act(pids)
    if not done["victims"] or "error" in done.get("host", {}):
        record(check, **done, roles=roles, seconds_to_ready=None, startup_before=0)
        return
    with Timeline(f"{check}_timeline", (UNIT,), every=1):
        back = wait_until(
            f"ready again after {done['signal']}",
            lambda: (
                supervisor_status().get("state") == "ready"
                and supervisor_status().get("pid") not in pids
            ),
            FAULT_TIMEOUT_S,
        )
    record(
        check,
        **done,
        roles=roles,
        startup_before=round(sum(before.get("seconds", {}).values()), 2),
        seconds_to_ready=round(time.monotonic() - started, 2) if back else None,
        status_after=supervisor_status(),
        crash_record=read_json(CRASH_RECORD),
        **show(UNIT, "ActiveState", "SubState", "Result", "NRestarts", "MainPID"),
    )
    epycctl_status(f"{check}_status", NAME)
    (chat_with or chat)(f"{check}_chat")


def member_status(endpoint: str, index: int) -> dict[str, Any]:
    """The supervisor's status file of instance `index` (0-based) of the set `endpoint`."""
    approval = json.loads(Path(f"/var/lib/epyc-llm/approvals/{endpoint}.json").read_text())
    member = approval["plan"]["decisions"]["servers"][index]
    return read_json(Path(member["status_file"])) or {}


def hang_instance(check: str, endpoint: str, index: int) -> None:
    """Every server process of instance `index` of the set `endpoint` stopped (SIGSTOP,
    never its supervisor): systemd's watchdog kills that instance alone and it comes back
    by itself, the set ready again. Recorded as engine_fault records a fault."""
    unit = f"epyc-llm-{endpoint}_{index + 1}.service"
    before = member_status(endpoint, index)
    victims = descendants(int(show(unit, "MainPID")["MainPID"] or 0))
    started = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGSTOP)
    back = wait_until(
        f"{unit} ready again after SIGSTOP",
        lambda: (
            member_status(endpoint, index).get("state") == "ready"
            and member_status(endpoint, index).get("pid") not in victims
            and endpoint_state(endpoint) == "ready"
        ),
        FAULT_TIMEOUT_S,
    )
    record(
        check,
        signal="SIGSTOP",
        victims=victims,
        startup_before=round(sum(before.get("seconds", {}).values()), 2),
        seconds_to_ready=round(time.monotonic() - started, 2) if back else None,
        status_after=member_status(endpoint, index),
        **show(unit, "ActiveState", "SubState", "Result", "NRestarts", "MainPID"),
    )


def instance_metrics(port: int) -> str | OSError:
    """An engine instance's own Prometheus /metrics on loopback, or why it did not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())
    except OSError as exc:
        return exc


def epycd_metrics() -> tuple[float, str | None, str]:
    """(seconds, text, error) of one GET of epycd's /metrics."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(METRICS, timeout=10) as reply:
            text: str | None = reply.read().decode()
            error = ""
    except OSError as exc:
        text, error = None, f"{type(exc).__name__}: {exc}"
    return round(time.monotonic() - started, 3), text, error


def sample_values(text: str | None, name: str) -> list[str]:
    """The lines of `name`'s samples for the endpoint, as the exposition has them."""
    return [
        line
        for line in (text or "").splitlines()
        if line.startswith(name + "{") and f'endpoint="{NAME}"' in line
    ]


def prometheus_query(expr: str) -> Any:
    port = CONFIG["prometheus_port"]
    query = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=10
        ) as reply:
            return json.loads(reply.read())["data"]["result"]
    except (OSError, ValueError, KeyError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


PROMETHEUS_CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: epyc-llm
    static_configs:
      - targets: ["127.0.0.1:9464"]
"""
TOKENS = f'sum(vllm_generation_tokens_total{{endpoint="{NAME}"}})'


def first_value(result: Any) -> float | None:
    try:
        return float(result[0]["value"][1])
    except (TypeError, LookupError, ValueError):
        return None


def prometheus_scrape() -> None:
    """Debian's Prometheus, on loopback, scrapes epycd every second while the endpoint
    serves chats: the endpoint's series with their labels, and its token counter before
    and after the chats. promtool checks one scrape of epycd's /metrics."""
    seconds, text, error = epycd_metrics()
    promtool = subprocess.run(
        [str(PROMETHEUS / "promtool"), "check", "metrics"],
        input=text or "", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    record(
        "epycd_metrics",
        seconds=seconds,
        error=error,
        bytes=len(text or ""),
        promtool_rc=promtool.returncode,
        promtool_output=(promtool.stdout + promtool.stderr)[-3000:],
    )
    work = Path("/var/tmp/prometheus")
    work.mkdir(parents=True, exist_ok=True)
    (work / "prometheus.yml").write_text(PROMETHEUS_CONFIG)
    server = subprocess.Popen(
        [str(PROMETHEUS / "prometheus"), f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{CONFIG['prometheus_port']}"],
        stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("wb"),
    )  # fmt: skip
    try:
        scraped = wait_until(
            "Prometheus has a scrape of the endpoint's tokens",
            lambda: first_value(prometheus_query(TOKENS)) is not None,
            90,
        )
        before = first_value(prometheus_query(TOKENS))
        for number in range(3):
            chat(f"prometheus_chat_{number}")
        grown = wait_until(
            "Prometheus sees the tokens grow",
            lambda: (first_value(prometheus_query(TOKENS)) or 0) > (before or 0),
            30,
        )
        record(
            "prometheus",
            scraped=scraped,
            grown=grown,
            before=before,
            after=first_value(prometheus_query(TOKENS)),
            target_up=prometheus_query('up{job="epyc-llm"}'),
            state=prometheus_query(f'epyc_llm_endpoint_state{{endpoint="{NAME}"}} == 1'),
            instance_up=prometheus_query(f'epyc_llm_instance_up{{endpoint="{NAME}"}}'),
            running=prometheus_query(f'vllm_num_requests_running{{endpoint="{NAME}"}}'),
            names=prometheus_query(f'count by (__name__) ({{endpoint="{NAME}"}})'),
            log=(work / "prometheus.log").read_text()[-2000:],
        )
    finally:
        server.terminate()
        server.wait(30)
    wait_until(
        "epycctl status shows the load with tokens/s",
        lambda: any(
            load.get("tokens_per_second")
            for load in endpoint_entry(epycctl_status("status_load", NAME), NAME).get("load", [])
        ),
        60,
        every=5,
    )


def metrics_while_stopped() -> None:
    """One scrape of epycd while the whole engine is stopped (SIGSTOP): bounded, and the
    instance reads as down."""
    time.sleep(1)
    seconds, text, error = epycd_metrics()
    record(
        "metrics_while_stopped",
        seconds=seconds,
        error=error,
        up=sample_values(text, "epyc_llm_instance_up"),
        vllm_samples=len(sample_values(text, "vllm_num_requests_running")),
    )


def wait_for_unit_to_settle(timeout: float) -> bool:
    """Until the endpoint's unit is active, failed or inactive: past its start and past the
    ExecStopPost= of a refused or failed run."""
    return wait_until(
        "the endpoint unit settles",
        lambda: show(UNIT, "ActiveState")["ActiveState"] in {"active", "failed", "inactive"},
        timeout,
    )


# --- the phases, one per boot -----------------------------------------------------------


class PhaseFailed(Exception):
    """A step the rest of the boot depends on failed: end the boot now, with the reason."""


def must(check: str, *argv: str, timeout: float) -> dict[str, Any]:
    done = run(*argv, timeout=timeout, check=check)
    if done["rc"] != 0:
        raise PhaseFailed(f"{check} failed (exit {done['rc']}): {done['stderr'][-2000:]}")
    return done


def give_model_to_group() -> None:
    """What the admin does for a local model: the product's group may read it, others not.
    (Read here, not at import: the container driver, inside_containers.py, has no model_dir.)"""
    model_dir = CONFIG["model_dir"]
    must("model_group", "chgrp", "-R", PRODUCT_USER, model_dir, timeout=60)
    must("model_mode", "chmod", "-R", "u+rwX,g+rX,g-w,o-rwx", model_dir, timeout=60)
    run("ls", "-lan", model_dir, check="model_perms")
    run("getent", "passwd", PRODUCT_USER, check="product_user")


def security(check: str, *units: str) -> None:
    """systemd's own reviewer on the live units (their exposure, lower is better)."""
    scores = {}
    for unit in units:
        out = run("systemd-analyze", "security", "--no-pager", unit, timeout=60)["stdout"]
        scores[unit] = [line for line in out.splitlines() if "Overall exposure" in line]
    record(check, scores=scores)


def reload_daemon() -> None:
    """`systemctl reload epycd` under the confined epycd.service: it plans again, stays up."""
    before = show("epycd.service", "MainPID")["MainPID"]
    run("systemctl", "reload", "epycd.service", timeout=300, check="reload")
    wait_until(
        "epycd active after reload",
        lambda: show("epycd.service", "ActiveState")["ActiveState"] == "active",
        300,
    )
    record("epycd_after_reload", main_pid_before=before, **show("epycd.service"))
    journal("journal_epycd_reload", "epycd.service")


def use_identity_root() -> None:
    """On a machine the product would refuse (not an AMD EPYC), plan against this machine's
    own topology under an EPYC identity (tests/machine.py), as an admin would with host_root."""
    if CONFIG["identity_root"]:
        DAEMON_CONF.write_text(f'host_root = "{CONFIG["identity_root"]}"\n')
        record("daemon_conf", text=DAEMON_CONF.read_text())


def phase_install() -> None:
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    must("install", "/src/packaging/install.sh", timeout=900)
    give_model_to_group()
    use_identity_root()
    record("epycd", **show("epycd.service", "Type", "ActiveState", "SubState", "StatusText",
                           "UnitFileState", "NotifyAccess", "MainPID"))  # fmt: skip
    record("on_path", found=[shutil.which(cmd, path=ENV["PATH"]) for cmd in ("epycctl", "epycd")])
    run("epycctl", "detect", "--json", check="detect")
    run("ls", "-ld", "/var/lib/epyc-llm", "/var/lib/epyc-llm/approvals", "/run/epyc-llm",
        check="tmpfiles")  # fmt: skip
    record("examples", files=sorted(p.name for p in Path("/etc/epyc-llm/examples").iterdir()))
    run("/src/packaging/install.sh", timeout=900, check="install_again")
    record("epycd_after_reinstall", **show("epycd.service"))

    ENDPOINT_FILE.write_text(CONFIG["endpoint_toml"])
    (ENDPOINT_FILE.parent / f"{NEVER}.toml").write_text(CONFIG["never_toml"])
    must("plan", "epycctl", "plan", NAME, "--json", timeout=300)
    with Timeline("approve_timeline", (UNIT,), every=0.5):
        approve = run("epycctl", "approve", NAME, "--yes", *CONFIG["consent_args"],
                      timeout=900, check="approve")  # fmt: skip
    if approve["rc"] != 0:
        serving_evidence()
        raise PhaseFailed(f"approve failed (exit {approve['rc']}): {approve['stderr'][-2000:]}")
    record("unit", **show(UNIT))
    serving_evidence()
    record_processes()
    chat("chat")
    epycctl_status("status")
    files_state("files")
    journal("journal_epycd", "epycd.service")
    security("security", UNIT, "epycd.service")
    journal_events("events", "approve", "install", "ready")


def phase_reboot() -> None:
    wait_for_daemon("boot_timeline")
    record("unit", **show(UNIT))
    serving_evidence()
    epycctl_status("status")
    files_state("files")
    record_processes()
    chat("chat")
    prometheus_scrape()
    journal("journal_epycd", "epycd.service")
    reload_daemon()
    epycctl_status("status_after_reload", NAME)
    record("crash_record_before_faults", record=read_json(CRASH_RECORD))
    engine_fault("kill_engine", signalled(signal.SIGKILL, whole_engine=False))
    engine_fault("stop_engine", signalled(signal.SIGSTOP, whole_engine=True))
    journal("journal_faults", UNIT)
    journal("journal_epycd_faults", "epycd.service")
    # Each fault below is one failed run; three in a row would be a crash loop, which is
    # not what they test: the records are cleared before them, as `epycctl start` does.
    for check, act in (
        ("kill_engine_core", killed("EngineCore")),
        ("kill_worker", killed("Worker")),
        ("oom_engine_core", oom_killed("EngineCore")),
    ):
        run("epycctl", "start", NAME, timeout=120, check=f"{check}_cleared")
        engine_fault(check, act)

    main_pid = show(UNIT, "MainPID")["MainPID"]
    edit_from, edit_to = CONFIG["edit"]
    ENDPOINT_FILE.write_text(ENDPOINT_FILE.read_text().replace(edit_from, edit_to))
    wait_until(
        "status says changed-needs-approval",
        lambda: endpoint_state(NAME) == "changed-needs-approval",
        120,
        every=2,
    )
    epycctl_status("status_after_edit", NAME)
    time.sleep(8)  # the daemon polls the folder every 3 s: let it see the edit
    record("unit_after_edit", main_pid_before=main_pid, **show(UNIT))
    files_state("files_after_edit")
    journal("journal_epycd_after_edit", "epycd.service")
    journal_events("events", "ready", "restart", "unhealthy", "drift")


def phase_edited_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_for_unit_to_settle(600)
    record("unit", **show(UNIT))
    serving_evidence()
    files_state("files")
    epycctl_status("status", NAME)
    chat("chat")

    ENDPOINT_FILE.write_text(CONFIG["endpoint_toml"])
    wait_until("status says ready again", lambda: endpoint_state(NAME) == "ready", 120, every=2)
    epycctl_status("status_restored", NAME)
    pids = record_processes()
    run("epycctl", "stop", NAME, timeout=120, check="stop")
    record("unit_after_stop", **show(UNIT, "ActiveState", "SubState", "UnitFileState"))
    record("pids_after_stop", alive=[pid for pid in pids if Path(f"/proc/{pid}").exists()])
    epycctl_status("status_after_stop", NAME)
    journal_events("events", "stop")


def phase_stopped_reboot() -> None:
    wait_for_daemon("boot_timeline")
    record("unit", **show(UNIT, "LoadState", "ActiveState", "SubState", "UnitFileState"))
    journal("journal_unit", UNIT)
    files_state("files")
    epycctl_status("status")
    break_weights()
    crash_loop()
    journal_events("events", "start")


WEIGHTS = Path(CONFIG.get("model_dir", "/srv/models/tiny")) / "model.safetensors"
GOOD_WEIGHTS = Path("/root/model.safetensors.good")


def break_weights() -> None:
    """One tensor renamed in place (`model.norm.weight` to `model.norm.weighx`): the header as
    well-formed as before and the sizes unchanged, so the planner (which reads sizes, and
    refuses a file cut short) passes it, and vLLM fails to load a tensor its model has no
    parameter for: a fault only the engine can find."""
    shutil.copy2(WEIGHTS, GOOD_WEIGHTS)
    data = bytearray(WEIGHTS.read_bytes())
    name, renamed = b'"model.norm.weight"', b'"model.norm.weighx"'
    at = data.find(name, 8)
    if at < 0:
        raise RuntimeError(f"no tensor {name!r} in {WEIGHTS}")
    data[at : at + len(name)] = renamed
    WEIGHTS.write_bytes(bytes(data))
    record("weights_broken", size=WEIGHTS.stat().st_size, renamed=renamed.decode().strip('"'))


def crash_loop() -> None:
    """The admin starts the stopped endpoint, on broken weights; nobody does anything after."""
    started = time.monotonic()
    run("epycctl", "start", NAME, timeout=900, check="start_broken")
    with Timeline("crash_loop_timeline", (UNIT,), every=1):
        looped = wait_until(
            "crash-loop", lambda: endpoint_state(NAME) == "crash-loop", FAULT_TIMEOUT_S, 2
        )
    seconds = round(time.monotonic() - started, 2)
    time.sleep(CRASH_LOOP_QUIET_S)  # nothing may start after the verdict
    record("crash_loop", looped=looped, seconds=seconds,
           **show(UNIT, "ActiveState", "SubState", "Result", "NRestarts"))  # fmt: skip
    journal("journal_crash_loop", UNIT)
    epycctl_status("status_crash_loop", NAME)


def phase_crashloop_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_for_unit_to_settle(300)
    time.sleep(CRASH_LOOP_QUIET_S)
    record("unit", **show(UNIT, "LoadState", "ActiveState", "SubState", "Result", "NRestarts"))
    journal("journal_unit", UNIT)
    epycctl_status("status", NAME)
    shutil.copy2(GOOD_WEIGHTS, WEIGHTS)
    run("epycctl", "start", NAME, timeout=900, check="start")
    record("unit_after_start", **show(UNIT))
    epycctl_status("status_after_start", NAME)
    DAEMON_CONF.write_text(f'host_root = "{CONFIG["fake_host"]}"\n')
    record("daemon_conf", text=DAEMON_CONF.read_text())


def phase_fakehost_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_for_unit_to_settle(300)
    record("unit", **show(UNIT, "LoadState", "ActiveState", "SubState", "Result", "UnitFileState"))
    journal("journal_unit", UNIT)
    journal("journal_epycd", "epycd.service")
    epycctl_status("status", NAME)


PHASES: dict[str, Callable[[], None]] = {
    "install": phase_install,
    "reboot": phase_reboot,
    "edited-reboot": phase_edited_reboot,
    "stopped-reboot": phase_stopped_reboot,
    "crashloop-reboot": phase_crashloop_reboot,
    "fakehost-reboot": phase_fakehost_reboot,
}


def main() -> None:
    record("start", phase=PHASE)
    try:
        PHASES[PHASE]()
    except PhaseFailed as failed:
        record("error", reason=str(failed))
    except Exception:
        record("error", traceback=traceback.format_exc())
    finally:
        record("done")
        subprocess.run(["systemctl", "poweroff", "--no-block"], check=False)


if __name__ == "__main__":
    main()
