"""The supervisor's watchdog (docs/healing.md, "Watchdog"), through a real sd_notify socket as
systemd would read it: WATCHDOG=1 while loading as long as the server lives; after READY only
while /health answers and the engine makes progress by vLLM's own /metrics (a stand-in
server whose answers the test changes while it runs: tests/health/stub_server.py --control);
why the pings stopped, in the journal and the status file; systemd's watchdog signal.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epycd.supervisor import SupervisorStatus, read_status
from tests.health.notifysock import NotifySocket
from tests.health.realvllm import REPO, free_port
from tests.health.supervising import session_members, start_supervisor, supervisor_argv

STUB = str(REPO / "tests" / "health" / "stub_server.py")
WATCHDOG_USEC = "2000000"
"""WatchdogSec=2: a check and a ping every second, /health bounded to 0.5 s."""
PERIOD = 1.0
STALL = 2.0
FROZEN = {"running": 2, "prompt": 10, "generation": 5}


class Served:
    """A supervisor over the stand-in server, with the socket it notifies and the control
    file the stand-in answers /health and /metrics from."""

    def __init__(self, tmp: Path, sock: NotifySocket) -> None:
        self.tmp = tmp
        self.sock = sock
        self.status_file = tmp / "run" / "status.json"
        self.log = tmp / "supervisor.log"
        self.control_file = tmp / "control.json"

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.process = start_supervisor(argv, env, self.log)
        return self.process

    def control(self, **said: Any) -> None:
        staged = self.control_file.with_suffix(".tmp")
        staged.write_text(json.dumps(said))
        staged.replace(self.control_file)

    def status(self) -> SupervisorStatus:
        status = read_status(self.status_file)
        assert status is not None, self.log.read_text()
        return status

    def pings(self, seconds: float) -> list[float]:
        """The times of the WATCHDOG=1 datagrams that arrive within `seconds` from now."""
        seen = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            message = self.sock.receive(left)
            if message is not None and "WATCHDOG=1" in message.split("\n"):
                seen.append(time.monotonic())
        return seen

    def wait_unhealthy(self, timeout: float) -> SupervisorStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.receive(0.1)
            status = read_status(self.status_file)
            if status is not None and status.unhealthy:
                return status
        raise AssertionError(f"never unhealthy; log:\n{self.log.read_text()}")


Serve = Callable[..., Served]


@pytest.fixture
def serve(tmp_path: Path, reap: list[subprocess.Popen[bytes]]) -> Iterator[Serve]:
    """Starts the supervisor over the stand-in with WATCHDOG_USEC and --stall-timeout."""
    sockets: list[NotifySocket] = []

    def start(*server_options: str, control: dict[str, Any] | None = None) -> Served:
        port = free_port()
        sock = NotifySocket(tmp_path / f"notify{len(sockets)}")
        sockets.append(sock)
        served = Served(tmp_path, sock)
        served.control(**(control or {}))
        server = [sys.executable, STUB, str(port), "tiny", "--control", str(served.control_file)]
        argv = supervisor_argv(
            url=f"http://127.0.0.1:{port}",
            model="tiny",
            status_file=served.status_file,
            server=[*server, *server_options],
            extra=("--stall-timeout", str(STALL)),
        )
        env = os.environ | {"NOTIFY_SOCKET": str(sock.path), "WATCHDOG_USEC": WATCHDOG_USEC}
        reap.append(served.start(argv, env))
        return served

    yield start
    for sock in sockets:
        sock.close()


def ready(served: Served) -> list[str]:
    """Every field the socket received up to READY=1."""
    assert served.sock.wait_for("READY=1", 30) is not None, served.log.read_text()
    return served.sock.fields()


def test_pings_while_loading_as_long_as_the_server_lives(serve: Serve) -> None:
    served = serve("--listen-after", "3.5")
    fields = ready(served)
    before_ready = fields[: fields.index("READY=1")]
    assert before_ready.count("WATCHDOG=1") >= 3, before_ready
    assert served.status().unhealthy is None


def test_a_frozen_engine_stops_the_pings_and_says_why(serve: Serve) -> None:
    served = serve(control=FROZEN)
    ready(served)
    assert served.pings(1.5), "pings while the stall bound has not passed"
    status = served.wait_unhealthy(STALL + 3)
    assert status.state == "ready" and status.phase == "serving"
    assert status.unhealthy is not None
    assert re.fullmatch(
        r"engine stalled: 2 requests running, no tokens for [23] s", status.unhealthy
    )
    assert served.pings(3 * PERIOD) == [], "no WATCHDOG=1 while stalled"
    text = served.log.read_text()
    lines = [line for line in text.splitlines() if "not pinging the watchdog" in line]
    assert len(lines) == 1, text
    assert "engine stalled: 2 requests running" in lines[0] and "WatchdogSec=" in lines[0]
    assert "STATUS=unhealthy: engine stalled: 2 requests running" in "\n".join(served.sock.fields())

    served.control(**FROZEN, moving=True)
    assert len(served.pings(2.5 * PERIOD)) >= 2, "pings again once tokens are counted"
    assert served.status().unhealthy is None
    assert "healthy again (was: engine stalled" in served.log.read_text()


@pytest.mark.parametrize(
    "control",
    [{**FROZEN, "moving": True}, {"running": 0, "prompt": 10, "generation": 5}],
    ids=["tokens-moving", "idle"],
)
def test_progress_or_idleness_keeps_the_pings(serve: Serve, control: dict[str, Any]) -> None:
    served = serve(control=control)
    ready(served)
    pings = served.pings(2 * STALL + 1)
    assert len(pings) >= 2 * STALL, pings
    assert max(b - a for a, b in itertools.pairwise(pings)) < 2 * PERIOD
    assert served.status().unhealthy is None
    assert "not pinging" not in served.log.read_text()


def test_a_hanging_health_stops_the_pings(serve: Serve) -> None:
    served = serve(control={"running": 0})
    ready(served)
    assert served.pings(1.5)
    served.control(health="hang")
    status = served.wait_unhealthy(4)
    assert status.unhealthy is not None
    assert status.unhealthy.startswith("health not answering for "), status.unhealthy
    assert "/health did not answer within 0.5 s" in status.unhealthy
    assert served.pings(3 * PERIOD) == []


def test_health_answering_an_error_stops_the_pings(serve: Serve) -> None:
    served = serve(control={"running": 0})
    ready(served)
    served.control(health=503)
    status = served.wait_unhealthy(4)
    assert status.unhealthy is not None
    assert "(/health answered HTTP 503)" in status.unhealthy, status.unhealthy
    assert served.pings(3 * PERIOD) == []


def test_an_unreadable_metrics_page_alone_does_not_stop_the_pings(serve: Serve) -> None:
    served = serve(control={**FROZEN, "metrics": 404})
    ready(served)
    pings = served.pings(2 * STALL + 1)
    assert len(pings) >= 2 * STALL, served.log.read_text()
    text = served.log.read_text()
    assert text.count("cannot read the engine's progress") == 1, text
    assert "/metrics answered HTTP 404" in text
    assert served.status().unhealthy is None


def test_the_watchdog_signal_keeps_the_reason_and_kills_the_server(serve: Serve) -> None:
    """systemd's default WatchdogSignal=SIGABRT: the status file says why, the server's
    process group is gone (a hung engine ignores SIGTERM), no core of the supervisor."""
    served = serve(control=FROZEN)
    ready(served)
    served.wait_unhealthy(STALL + 3)
    pid = served.status().pid
    assert pid is not None
    served.process.send_signal(signal.SIGABRT)
    assert served.process.wait(10) == 128 + signal.SIGABRT
    status = served.status()
    assert (status.state, status.phase) == ("failed", "watchdog")
    assert "killed by systemd's watchdog" in status.reason
    assert "engine stalled: 2 requests running" in status.reason
    deadline = time.monotonic() + 5
    while session_members(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not session_members(pid)
