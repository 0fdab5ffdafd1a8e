"""Running `python -m epycd.supervisor` the way a Type=notify unit does."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil

from epycd.supervisor import SupervisorStatus, read_status
from tests.health.realvllm import REPO


def supervisor_argv(
    *,
    url: str,
    model: str,
    status_file: Path,
    server: list[str],
    extra: tuple[str, ...] = (),
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "epycd.supervisor",
        "--name",
        "tiny-endpoint",
        "--url",
        url,
        "--served-model-name",
        model,
        "--status-file",
        str(status_file),
        *extra,
        "--",
        *server,
    ]


def exec_start(unit: str) -> list[str]:
    """A planned unit's ExecStart= words (the plan's are plain paths and flags: shlex reads
    them as systemd does)."""
    [line] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def start_supervisor(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )


def session_members(session: int) -> list[int]:
    """Processes still alive (not zombies) in the server's session."""
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getsid(process.pid) == session and process.info["status"] != "zombie":
                members.append(process.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def wait_for_state(path: Path, timeout: float) -> SupervisorStatus | None:
    """The status file once it has left "starting" (None if it has not within `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(path)
        if status is not None and status.state != "starting":
            return status
        time.sleep(0.1)
    return None
