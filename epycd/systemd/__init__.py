"""A thin wrapper over `systemctl` and `journalctl`: every call is a subprocess with a
timeout, and every failure is an `SystemdError` naming the command and systemd's own words.

The tools are found on PATH, so a test can put a recording `systemctl` first on PATH where a
real systemd cannot run (systemd is not PID 1 there); the code path stays the real one.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from epycd.errors import Refusal

QUERY_TIMEOUT_S = 15.0
CHANGE_TIMEOUT_S = 90.0
STDERR_TAIL = 5


class SystemdError(Refusal):
    """systemctl or journalctl failed or could not run. Exit 1."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemdError(
            f"`{name}` not found on PATH",
            fix="install systemd, or use --no-start / --no-stop where no systemd runs",
        )
    return path


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-STDERR_TAIL:])


def run(
    tool: str, args: Sequence[str], *, timeout: float, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `tool args`; with `check`, a non-zero exit is a `SystemdError`."""
    argv = [_tool(tool), *args]
    shown = " ".join([tool, *args])
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SystemdError(
            f"`{shown}` did not finish within {timeout:g} s",
            fix=f"see `journalctl -xe` and `{tool} status`",
        ) from None
    except OSError as exc:
        raise SystemdError(f"`{shown}` could not run: {exc.strerror}") from None
    if check and done.returncode != 0:
        said = _tail(done.stderr) or _tail(done.stdout) or "no message"
        raise SystemdError(f"`{shown}` failed (exit {done.returncode}): {said}")
    return done


def systemctl(*args: str, timeout: float = CHANGE_TIMEOUT_S) -> str:
    return run("systemctl", args, timeout=timeout).stdout


def daemon_reload() -> None:
    systemctl("daemon-reload")


def enable(units: Sequence[str]) -> None:
    if units:
        systemctl("enable", *units)


def disable(units: Sequence[str]) -> None:
    if units:
        systemctl("disable", *units)


def start(units: Sequence[str], *, timeout: float = CHANGE_TIMEOUT_S) -> None:
    """Start and wait: for `Type=notify` units systemctl returns once READY=1 arrived."""
    if units:
        systemctl("start", *units, timeout=timeout)


def restart(units: Sequence[str], *, timeout: float = CHANGE_TIMEOUT_S) -> None:
    """Start, or stop and start when running: how changed units take effect."""
    if units:
        systemctl("restart", *units, timeout=timeout)


def stop(units: Sequence[str], *, timeout: float = CHANGE_TIMEOUT_S) -> None:
    if units:
        systemctl("stop", *units, timeout=timeout)


def reset_failed(units: Sequence[str]) -> None:
    """Forget the units' failed state and start-limit counters (`systemctl reset-failed`)."""
    if units:
        systemctl("reset-failed", *units)


def is_active(unit: str) -> str:
    """`active`, `inactive`, `failed`, `activating`, ... (systemctl exits 3 when not active)."""
    done = run("systemctl", ["is-active", unit], timeout=QUERY_TIMEOUT_S, check=False)
    state = done.stdout.strip()
    if not state:
        raise SystemdError(f"`systemctl is-active {unit}` answered nothing: {_tail(done.stderr)}")
    return state


def is_enabled(unit: str) -> str:
    """`enabled`, `disabled`, `static`, `generated`, `not-found`, ..."""
    done = run("systemctl", ["is-enabled", unit], timeout=QUERY_TIMEOUT_S, check=False)
    state = done.stdout.strip()
    if state:
        return state
    if "not found" in done.stderr.lower() or "no such file" in done.stderr.lower():
        return "not-found"
    raise SystemdError(f"`systemctl is-enabled {unit}` answered nothing: {_tail(done.stderr)}")


def unit_jobs(unit: str, *, user: bool = False) -> list[str] | None:
    """The types of the jobs systemd has queued or running for `unit` (`start`, `stop`,
    `restart`, ...; `systemctl list-jobs`), or None when the manager cannot be asked. A unit
    that systemd is stopping has its stop (or restart) job running until it is inactive,
    through ExecStopPost=; a run that ended by itself has none."""
    args = ["--user"] if user else []
    args += ["list-jobs", "--no-legend", "--plain", "--full", unit]
    try:
        done = run("systemctl", args, timeout=QUERY_TIMEOUT_S)
    except SystemdError:
        return None
    jobs = []
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == unit:
            jobs.append(fields[2])
    return jobs


def journal(units: Sequence[str], lines: int = 50) -> str:
    """The last `lines` journal lines of `units`, oldest first."""
    args = ["--no-pager", "--output=short-iso", f"--lines={lines}"]
    for unit in units:
        args += ["--unit", unit]
    return run("journalctl", args, timeout=QUERY_TIMEOUT_S).stdout
