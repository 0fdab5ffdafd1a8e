"""`epycctl status NAME` shows a serving endpoint's live load: the running epycd's last
minute (its `RUN_DIR/status.json`, written by the real daemon), or the instance's /metrics
read once now when no epycd runs. The instance is a real local HTTP server answering the
recorded vLLM 0.32.0 exposition with the values each test sets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epycd.daemon import Daemon
from epycd.paths import DAEMON_STATUS_FILE
from epycd.plan.endpoint import Plan
from epycd.settings import Settings
from epycd.status.collect import planned_map
from epycd.status.daemon_file import daemon_loads, is_epycd
from tests.daemon.conftest import DaemonSandbox, real_plan_endpoints
from tests.metrics.servers import answering, in_unit, recorded

UNIT = "epyc-llm-chat.service"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV = "vllm:kv_cache_usage_perc"
GENERATED = "vllm:generation_tokens_total"
BUSY = {RUNNING: 3.0, WAITING: 2.0, KV: 0.375}


def recorded_value(name: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", recorded(), re.M)
    assert found, name
    return float(found[1])


def exposition(values: dict[str, float]) -> str:
    """The recorded exposition with each named (one-series) family's value replaced."""
    text = recorded()
    for name, value in values.items():
        text, count = re.subn(
            rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M
        )
        assert count == 1, name
    return text


class Growing:
    """A busy instance: BUSY's values, and `step` more generated tokens at every read."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.reads = 0

    def __call__(self) -> str:
        generated = recorded_value(GENERATED) + self.step * self.reads
        self.reads += 1
        return exposition(BUSY | {GENERATED: generated})


@pytest.fixture
def epycd_process(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process shaped like the installed daemon: a Python script named epycd."""
    script = tmp_path / "bin" / "epycd"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    script.chmod(0o755)
    process = subprocess.Popen([str(script)])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)


def wait_for_exec(pid: int) -> None:
    """Until the child has exec'd the script (Popen returns once it forked)."""
    deadline = time.monotonic() + 5
    while not is_epycd(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_only_a_live_epycd_is_epycd(epycd_process: subprocess.Popen[bytes]) -> None:
    wait_for_exec(epycd_process.pid)
    assert is_epycd(epycd_process.pid)
    assert not is_epycd(os.getpid()), "a live process that is not epycd"
    assert not is_epycd(dead_pid())
    assert not is_epycd(0) and not is_epycd(-1)


def serving(ws: DaemonSandbox) -> Plan:
    """Endpoint chat approved and ready (its vLLM on `plan.decisions.port`)."""
    ws.endpoint("chat")
    approval = ws.approve("chat")
    ws.set_unit(UNIT, "active")
    ws.supervisor_says("chat", "ready", phase="request")
    return approval.plan


def status_of(ws: DaemonSandbox, *args: str) -> subprocess.CompletedProcess[str]:
    done = ws.epycctl("status", "chat", *args)
    assert done.returncode == 0, done.stderr
    return done


def chat_json(ws: DaemonSandbox) -> dict[str, object]:
    data = json.loads(status_of(ws, "--json").stdout)
    [chat] = data["endpoints"]
    assert chat["state"] == "ready"
    assert isinstance(chat, dict)
    return chat


def planned_daemon(ws: DaemonSandbox, plan: Plan) -> Daemon:
    """The real daemon having planned, before the instance listens (as when the endpoint
    starts: the listener of these tests is not in the endpoint's unit)."""
    daemon = Daemon(ws.settings)
    daemon.approved = {"chat": plan}
    daemon.planned = dict(planned_map(real_plan_endpoints(ws.settings)[0]))
    return daemon


def readings_written(daemon: Daemon, readings: int, gap_s: float) -> dict[str, Any]:
    """The daemon's refreshes (each reads the serving instances' /metrics), then its
    status.json as written."""
    for number in range(readings):
        if number:
            time.sleep(gap_s)
        daemon.refresh()
    daemon.publish()
    path = daemon.settings.run_dir / DAEMON_STATUS_FILE
    written: dict[str, Any] = json.loads(path.read_text())
    return written


def with_pid(ws: DaemonSandbox, written: dict[str, Any], pid: int) -> None:
    """The daemon's file as it wrote it, but for the pid."""
    written["daemon"]["pid"] = pid
    (ws.settings.run_dir / DAEMON_STATUS_FILE).write_text(json.dumps(written))


@pytest.mark.vllm
def test_no_epycd_reads_the_instance_now(ws: DaemonSandbox) -> None:
    port = serving(ws).decisions.port
    body = ws.tmp / "metrics.txt"
    body.write_text(exposition(BUSY))
    with in_unit(UNIT, body, port):
        chat = chat_json(ws)
        text = status_of(ws).stdout
    assert chat["load"] == [
        {
            "instance": 0,
            "running": BUSY[RUNNING],
            "waiting": BUSY[WAITING],
            "kv_cache_usage": BUSY[KV],
            "tokens_per_second": None,
            "window_seconds": 0.0,
        }
    ]
    kv = f"KV {BUSY[KV] * 100:.0f} %"
    line = f"running {BUSY[RUNNING]:g}, waiting {BUSY[WAITING]:g}, {kv}"
    assert f"load (read now): {line}, tokens/s: needs epycd running" in text


@pytest.mark.vllm
def test_a_silent_instance_says_why(ws: DaemonSandbox) -> None:
    serving(ws)  # nothing listens on its port
    chat = chat_json(ws)
    assert chat["load"] == []
    assert re.search(r"load \(read now\): no load: http://127\.0\.0\.1:\d+/metrics: Connect",
                     status_of(ws).stdout)  # fmt: skip


@pytest.mark.vllm
def test_the_running_epycd_gives_the_last_minute(
    ws: DaemonSandbox, epycd_process: subprocess.Popen[bytes]
) -> None:
    plan = serving(ws)
    step = 120.0
    daemon = planned_daemon(ws, plan)
    with answering(Growing(step), port=plan.decisions.port):
        written = readings_written(daemon, readings=3, gap_s=0.5)
    assert written["daemon"]["pid"] == os.getpid()
    [chat_written] = written["endpoints"]
    [load] = chat_written["load"]
    assert 1.0 <= load["window_seconds"] < 10  # two gaps and the refreshes' own time
    # two more reads' worth of tokens over the span between the first and the last read
    assert load["tokens_per_second"] == pytest.approx(2 * step / load["window_seconds"], rel=0.1)
    assert (load["running"], load["waiting"], load["kv_cache_usage"]) == (
        BUSY[RUNNING],
        BUSY[WAITING],
        BUSY[KV],
    )

    # written by a process that is not epycd (this test): not trusted; nothing answers now
    with_pid(ws, written, os.getpid())
    assert daemon_loads(ws.settings) == {}
    assert chat_json(ws)["load"] == []

    # a crashed daemon's file: its pid is gone
    with_pid(ws, written, dead_pid())
    assert daemon_loads(ws.settings) == {}

    with_pid(ws, written, epycd_process.pid)
    wait_for_exec(epycd_process.pid)
    assert [item.model_dump() for item in daemon_loads(ws.settings)["chat"]] == [load]
    assert chat_json(ws)["load"] == [load]
    text = status_of(ws).stdout
    tokens = f"{load['tokens_per_second']:g} tokens/s (last {load['window_seconds']:g} s)"
    assert (
        f"load: running {BUSY[RUNNING]:g}, waiting {BUSY[WAITING]:g}, "
        f"KV {BUSY[KV] * 100:.0f} %, {tokens}" in text
    )
    assert "read now" not in text


def test_a_garbled_or_absent_file_is_no_load(
    tmp_path: Path, epycd_process: subprocess.Popen[bytes]
) -> None:
    settings = Settings(run_dir=tmp_path, state_dir=tmp_path, config_dir=tmp_path)
    assert daemon_loads(settings) == {}
    pid = epycd_process.pid
    for content in ("", "{", "[]", f'{{"daemon": {{"pid": "{pid}"}}, "endpoints": []}}', "\0"):
        (tmp_path / DAEMON_STATUS_FILE).write_text(content)
        assert daemon_loads(settings) == {}, content
    good = {"instance": 1, "running": 1, "waiting": 0, "kv_cache_usage": 0.5}
    good |= {"tokens_per_second": 7.5, "window_seconds": 50}
    endpoints = [{"name": "x", "load": "no"}, {"name": "y", "load": [{"instance": 0}]}]
    endpoints += [{"load": [good]}, {"name": "z", "load": [good]}]
    (tmp_path / DAEMON_STATUS_FILE).write_text(
        json.dumps({"daemon": {"pid": pid}, "endpoints": endpoints})
    )
    wait_for_exec(pid)
    assert {
        name: [i.model_dump() for i in kept] for name, kept in daemon_loads(settings).items()
    } == {"z": [good]}


def test_a_set_shows_a_line_per_instance() -> None:
    from epycd.cli.status import details
    from epycd.status.instances import InstanceLoad, InstanceStatus
    from epycd.status.machine import EndpointStatus

    instances = [
        InstanceStatus(instance=n, unit=f"epyc-llm-multi-{n}.service", state="ready",
                       port=8100 + n, cpus=f"{4 * n}-{4 * n + 3}", numa_nodes=[n])
        for n in (0, 1)
    ]  # fmt: skip
    loads = [
        InstanceLoad(instance=n, running=n + 1, waiting=n, kv_cache_usage=0.25 * (n + 1),
                     tokens_per_second=12.5 * (n + 1), window_seconds=60)
        for n in (0, 1)
    ]  # fmt: skip
    status = EndpointStatus(
        name="multi", state="ready", unit="epyc-llm-multi.service", instances=instances, load=loads
    )
    lines = details(status).splitlines()
    first = lines.index("  load:")
    assert lines[first + 1 : first + 3] == [
        f"    instance {load.instance}: running {load.running:g}, waiting {load.waiting:g}, "
        f"KV {(load.kv_cache_usage or 0) * 100:.0f} %, {load.tokens_per_second:g} tokens/s "
        "(last 60 s)"
        for load in loads
    ]
    status.state = "failed:instances"
    assert "load" not in details(status)
