"""Helpers for the isolation tests: two approved endpoints, the real `epycctl status`, the
real boot check and the real daemon, each in its own process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.sandbox import REPO

NAMES = ("alpha", "beta")
DAEMON_WAIT_S = 90.0


def approve_two(env: ApprovalSandbox) -> None:
    """`alpha` (socket 0, port 8000) and `beta` (socket 1, port 8001), approved --no-start."""
    host, config = env.host(), env.settings.config_dir
    env.install_fake_systemctl()
    env.set_plans(
        make_plan("alpha", host, config, socket=0, port=8000),
        make_plan("beta", host, config, socket=1, port=8001),
    )
    for name in NAMES:
        done = env.epycctl("approve", name, "--yes", "--no-start")
        assert done.returncode == 0, done.stderr


def run_product(
    env: ApprovalSandbox, *args: str, module: str = "epycd"
) -> subprocess.CompletedProcess[str]:
    """The product itself (its own planner), not the planned_epycctl of `env.epycctl`."""
    return env.epycctl(*args, module=module)


def assert_clean(done: subprocess.CompletedProcess[str], *codes: int) -> None:
    """Ended with one of `codes` and without a Python traceback."""
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert done.returncode in codes, (done.returncode, output)


def status_rows(env: ApprovalSandbox) -> dict[str, dict[str, Any]]:
    """`epycctl status --json` by endpoint; it must succeed."""
    done = run_product(env, "status", "--json")
    assert_clean(done, 0)
    return {row["name"]: row for row in json.loads(done.stdout)["endpoints"]}


def boot_check(env: ApprovalSandbox, name: str) -> subprocess.CompletedProcess[str]:
    done = run_product(env, name, module="epycd.approval.check")
    assert_clean(done, 0, 1, 2)
    return done


def daemon_status(env: ApprovalSandbox) -> dict[str, dict[str, Any]]:
    """Start the real daemon, wait for its status.json, stop it with SIGTERM: it must write
    the file, exit 0 and print no traceback. The endpoints by name."""
    status_file = env.settings.run_dir / "status.json"
    status_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "epycd.daemon", "--settle-timeout", "0"],
        env=env.environ(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + DAEMON_WAIT_S
    try:
        while not _daemon_ready(status_file) and process.poll() is None:
            assert time.monotonic() < deadline, "the daemon wrote no status.json"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert process.returncode == 0, err
    data = json.loads(status_file.read_text())
    return {row["name"]: row for row in data["endpoints"]}


def _daemon_ready(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text())["daemon"]["state"] == "ready")
    except (OSError, ValueError, KeyError):
        return False
