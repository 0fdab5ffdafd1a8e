"""Benchmark: `epycd` at idle, CPU % over 60 s and RSS.

Target (set when the daemon was built, and kept when its metrics were added): under 0.5 %
CPU over 60 s, RSS under 80 MB.

Run:  .venv/bin/python benchmarks/daemon.py [--seconds 60] [--poll 3] [--refresh 10]
                                            [--scrape-interval 15] [--no-metrics]
(needs tests/bootstrap.sh for the vLLM CPU venv: the host path is planned against it.)

Setup, all in a temporary folder: the EPYCD_* folders, a fake 2-socket Genoa host root (the
planner's input; the daemon itself runs on this machine), a local model folder, two endpoint
files on the host path (one approved by the approval code and marked ready by a supervisor
status file, one pending approval). The real `systemctl` of this machine is used: systemd is
not PID 1 here, so each refresh's `systemctl show` fails fast and the state falls back on the
status file; with systemd as PID 1 that call succeeds at similar cost. The daemon runs with
its default intervals, under a NOTIFY_SOCKET this script binds; measuring starts 5 s after
READY=1. With the metrics on (the default), epycd serves /metrics on a free loopback port,
the approved endpoint's port answers the recorded /metrics of the real vLLM 0.32
(tests/metrics/, started after READY=1 so the plan does not see its port taken; epycd
reads it at each refresh for the load), and this script scrapes epycd every
`--scrape-interval` seconds as Prometheus would (15 s is Prometheus's default; 0: never).
CPU is the daemon's user+system time plus its reaped children's (the systemctl
calls), divided by the wall time; RSS is sampled every second, the maximum is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epycd.approval.record import current_approver  # noqa: E402
from epycd.approval.workflow import install_approval, make_approval  # noqa: E402
from epycd.plan.pipeline.current import plan_endpoints  # noqa: E402
from epycd.render import render_for_plan  # noqa: E402
from epycd.settings import Settings  # noqa: E402
from epycd.supervisor import SupervisorStatus, write_status  # noqa: E402
from tests.health.notifysock import NotifySocket  # noqa: E402
from tests.hosts import make_host  # noqa: E402
from tests.metrics.servers import answering, closed_port  # noqa: E402
from tests.plan.conftest import write_model  # noqa: E402

CACHE = Path(os.environ.get("EPYC_TEST_CACHE", "/var/cache/epyc-llm-test"))
VLLM = CACHE / "vllm-venv" / "bin" / "vllm"
FOLDERS = ("config_dir", "state_dir", "run_dir", "unit_dir", "quadlet_dir")


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs, "
        f"{psutil.virtual_memory().total / 1024**3:.1f} GiB RAM, "
        f"kernel {platform.release()}, Python {platform.python_version()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


def workspace(base: Path) -> tuple[Settings, dict[str, str], int]:
    folders = {key: base / key for key in FOLDERS}
    for folder in folders.values():
        folder.mkdir()
    host_root = make_host(base / "hosts", "genoa-9654-2s-nps1")
    settings = Settings.model_validate({**folders, "host_root": host_root})
    env = {f"EPYCD_{key.upper()}": str(path) for key, path in folders.items()}
    env["EPYCD_HOST_ROOT"] = str(host_root)
    env["HF_HOME"] = str(base / "hf")
    (base / "hf").mkdir()
    os.environ.update(env)
    model = write_model(base / "models" / "qwen3")
    for name in ("chat", "base"):
        (settings.config_dir / f"{name}.toml").write_text(
            f'model = "{model}"\nruntime = "host"\nvllm = "{VLLM}"\nport = "auto"\n'
        )
    results, host = plan_endpoints(settings, {}, render=render_for_plan)
    chat = next(r for r in results if r.endpoint == "chat")
    assert chat.plan is not None, [p.text for p in chat.errors]
    approval = make_approval(
        settings, chat.plan, host, current_approver(), accepted_unvalidated=False
    )
    install_approval(settings, approval)
    write_status(
        settings.run_dir / "chat.json",
        SupervisorStatus(state="ready", name="chat", url="http://127.0.0.1:8000", model="chat"),
    )
    return settings, env, chat.plan.decisions.port


def scrape(url: str) -> float:
    """The seconds one GET of epycd's /metrics took (this process's time, not epycd's)."""
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as reply:
        reply.read()
    return time.monotonic() - started


def measure(
    env: dict[str, str], args: argparse.Namespace, base: Path, port: int
) -> dict[str, float]:
    listen = f"127.0.0.1:{closed_port()}" if args.metrics else ""
    env = {**env, "EPYCD_METRICS_LISTEN": listen}
    scrapes: list[float] = []
    with NotifySocket(base / "notify.sock") as sock:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "epycd.daemon",
                "--poll-interval",
                str(args.poll),
                "--refresh-interval",
                str(args.refresh),
            ],
            env={**os.environ, **env, "NOTIFY_SOCKET": str(sock.path), "PYTHONPATH": str(REPO)},
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            started = time.monotonic()
            ready = sock.wait_for("READY=1", 300)
            if ready is None:
                raise SystemExit("epycd did not send READY=1 within 300 s")
            ready_s = time.monotonic() - started
            with answering(port=port) if args.metrics else contextlib.nullcontext(port):
                time.sleep(5)
                proc = psutil.Process(process.pid)
                before, wall0 = proc.cpu_times(), time.monotonic()
                rss = [proc.memory_info().rss]
                next_scrape = wall0
                while time.monotonic() - wall0 < args.seconds:
                    if listen and args.scrape_interval and time.monotonic() >= next_scrape:
                        scrapes.append(scrape(f"http://{listen}/metrics"))
                        next_scrape += args.scrape_interval
                    time.sleep(1)
                    rss.append(proc.memory_info().rss)
                after, wall = proc.cpu_times(), time.monotonic() - wall0
        finally:
            process.terminate()
            process.wait(30)
    used = sum(
        getattr(after, f) - getattr(before, f)
        for f in ("user", "system", "children_user", "children_system")
    )
    return {
        "seconds": round(wall, 1),
        "cpu_seconds": round(used, 3),
        "cpu_percent": round(100 * used / wall, 3),
        "rss_mb_max": round(max(rss) / 1e6, 1),
        "rss_mib_max": round(max(rss) / 1024**2, 1),
        "ready_after_start_s": round(ready_s, 2),
        "scrapes": len(scrapes),
        "scrape_seconds_max": round(max(scrapes), 3) if scrapes else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--poll", type=float, default=3.0, help="epycd --poll-interval")
    parser.add_argument("--refresh", type=float, default=10.0, help="epycd --refresh-interval")
    parser.add_argument(
        "--scrape-interval", type=float, default=15.0, help="seconds between scrapes; 0: none"
    )
    parser.add_argument(
        "--no-metrics", dest="metrics", action="store_false", help='metrics_listen = ""'
    )
    args = parser.parse_args()
    if not VLLM.exists():
        raise SystemExit(f"{VLLM} is missing: run tests/bootstrap.sh")
    base = Path(tempfile.mkdtemp(prefix="epycd-bench-"))
    try:
        _settings, env, port = workspace(base)
        result = measure(env, args, base, port)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"machine": machine(), "args": vars(args), **result}, indent=2))
    ok = result["cpu_percent"] < 0.5 and result["rss_mb_max"] < 80
    print("within target (< 0.5 % CPU, < 80 MB RSS):", "yes" if ok else "NO")


if __name__ == "__main__":
    main()
