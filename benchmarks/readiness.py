"""Benchmark: how soon READY=1 reaches systemd after a real vLLM starts answering.

Target (set when the health gate was built): READY=1 within 0.5 s after the server's /health
first answers 200, plus the smoke request's own time.

Run:  .venv/bin/python benchmarks/readiness.py [--runs 3]
(needs tests/bootstrap.sh: the vLLM CPU venv and the tiny model under $EPYC_TEST_CACHE.)

Each run starts `python -m epycd.supervisor -- vllm serve <tiny model>` under a NOTIFY_SOCKET
this script binds, polls /health itself every 10 ms from another thread, time-stamps the
first 200 and the READY=1 datagram on the same monotonic clock, reads the gate's per-phase
seconds from the status file, sums the RSS of vLLM's processes once ready, then stops the
supervisor with SIGTERM and times the stop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epycd.supervisor import read_status  # noqa: E402
from tests.health.notifysock import NotifySocket  # noqa: E402
from tests.health.realvllm import (  # noqa: E402
    ServingTest,
    free_port,
    serve_argv,
    tiny_model,
    vllm_env,
)
from tests.health.supervising import (  # noqa: E402
    session_members,
    start_supervisor,
    supervisor_argv,
)

SLACK_S = 0.5
POLL_S = 0.01


class HealthWatcher(threading.Thread):
    """Polls /health independently of the gate; remembers when it first answered 200."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.first_200: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=0.5) as client:
            while not self.stop.is_set() and self.first_200 is None:
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        self.first_200 = time.monotonic()
                except httpx.HTTPError:
                    pass
                self.stop.wait(POLL_S)


def memory_mib(pids: list[int]) -> tuple[float, float]:
    """Summed RSS (counts shared torch pages once per process) and PSS (shares them out)."""
    rss = pss = 0
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss += info.rss
        pss += info.pss
    return rss / 2**20, pss / 2**20


def one_run(work: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    status_file = work / "status.json"
    argv = supervisor_argv(
        url=url,
        model="tiny",
        status_file=status_file,
        server=serve_argv(tiny_model(), port, "tiny"),
    )
    with NotifySocket(work / "notify") as sock:
        ServingTest.marked = True  # a benchmark runs alone; vllm_env guards the test suite
        env = vllm_env(work) | {"NOTIFY_SOCKET": str(sock.path)}
        watcher = HealthWatcher(url)
        started = time.monotonic()
        supervisor = start_supervisor(argv, env, work / "supervisor.log")
        watcher.start()
        try:
            if sock.wait_for("READY=1", 600) is None:
                raise SystemExit(f"no READY=1; see {work / 'supervisor.log'}")
            ready_at = next(t for t, m in sock.messages if "READY=1" in m.split("\n"))
            watcher.join(5)
            status = read_status(status_file)
            assert status is not None and status.pid is not None
            server_pids = session_members(status.pid)
            server_rss, server_pss = memory_mib(server_pids)
            supervisor_rss = memory_mib([supervisor.pid])[0]
            stop_started = time.monotonic()
            supervisor.send_signal(signal.SIGTERM)
            code = supervisor.wait(120)
            stopped_s = time.monotonic() - stop_started
        finally:
            watcher.stop.set()
            if supervisor.poll() is None:
                supervisor.kill()
    if watcher.first_200 is None:
        raise SystemExit("the independent /health poller never saw 200")
    seconds = status.seconds
    delay = ready_at - watcher.first_200
    return {
        "startup_s": round(ready_at - started, 2),
        "health_200_s": round(watcher.first_200 - started, 2),
        "ready_after_health_s": round(delay, 3),
        "gate_s": seconds,
        "bound_s": round(SLACK_S + seconds["request"], 3),
        "ok": delay <= SLACK_S + seconds["request"],
        "server_processes": len(server_pids),
        "server_rss_mib": round(server_rss),
        "server_pss_mib": round(server_pss),
        "supervisor_rss_mib": round(supervisor_rss, 1),
        "stop_s": round(stopped_s, 2),
        "exit": code,
    }


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="epyc-readiness-") as work:
            result = one_run(Path(work))
        results.append(result)
        print(f"run {index + 1}: {json.dumps(result)}", flush=True)
    delays = [r["ready_after_health_s"] for r in results]
    print(f"machine: {machine()}; load average {os.getloadavg()}")
    print(
        f"READY after /health 200: min {min(delays):.3f} s, median {statistics.median(delays):.3f}"
        f" s, max {max(delays):.3f} s; bound 0.5 s + request; all within: "
        f"{all(r['ok'] for r in results)}"
    )
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
