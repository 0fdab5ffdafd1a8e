"""The endpoint supervisor: the main process of a `Type=notify` unit (host and docker paths).

    python -m epycd.supervisor --name NAME --url http://127.0.0.1:PORT \\
        --served-model-name ID --endpoint chat_completions \\
        [--api-key-file F | --api-key-credential NAME] \\
        [--status-file PATH] -- <server argv...>

It starts the server (its output passes through to the journal; the last lines are kept
for failure reports), runs the health gate, then tells systemd `READY=1` with a `STATUS=`.
With `WatchdogSec=` (docs/healing.md, "Watchdog") it pings `WATCHDOG=1` at half of
`WATCHDOG_USEC`: while loading as long as the server process lives (the start is bounded by
`TimeoutStartSec=`, not by the watchdog), and after READY only while `/health` answers
within its timeout and the engine is not stalled (requests running and vLLM's token
counters in `/metrics` still for `--stall-timeout` seconds). When it stops pinging it logs
one line saying why and keeps the reason in the status file (`unhealthy`), so that the
crash recorder (`epycd.approval.crashloop`) can name it after the watchdog killed the unit.
Each run that passes the gate adds itself to the count the file carries from the runs
before it since boot (`ready_runs`, `ready_seconds`: an on-demand endpoint's cold starts).
It forwards SIGTERM/SIGINT to the server and exits with the server's status; a server that
exits by itself, even with 0, makes it exit 1 (a failed run). When the gate
fails it logs the phase, the reason and the server's last lines, keeps them in the status
file for `epycctl status`, stops the server and exits 1. No retry: systemd's Restart=
restarts the unit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from epycd.readfile import STATE_MAX_BYTES, read_bytes

SupervisorState = Literal["starting", "ready", "failed", "stopped"]


class SupervisorStatus(BaseModel):
    """What the status file holds; `phase` is a gate phase, or "serving" after READY.

    "stopped" is written when the supervisor was asked to stop (SIGTERM/SIGINT) and the
    server has exited; `reason` then carries the server's exit status.
    """

    state: SupervisorState
    name: str
    url: str
    model: str
    phase: str | None = None
    reason: str = ""
    log_tail: list[str] = Field(default_factory=list)
    first_error: list[str] = Field(
        default_factory=list,
        description="the server's first exception line and the lines before it: the root "
        "cause is often far above the tail",
    )
    seconds: dict[str, float] = Field(default_factory=dict)
    unhealthy: str | None = Field(
        default=None,
        description="state ready: why the supervisor stopped pinging the watchdog (health not "
        "answering, engine stalled); systemd kills the unit unless it recovers",
    )
    pid: int | None = Field(default=None, description="the server's process id")
    invocation: str | None = Field(
        default=None,
        description="systemd's INVOCATION_ID of the run that wrote it: the crash recorder "
        "takes the reason of this run only, never an earlier run's",
    )
    since: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    ready_runs: int = Field(
        default=0,
        description="the runs that passed the gate since boot (the file is in RUN_DIR), this "
        "one included once it has: an on-demand endpoint's cold starts",
    )
    ready_seconds: float = Field(default=0.0, description="those runs' start-ups, summed")


def read_status(path: Path) -> SupervisorStatus | None:
    """The status a supervisor last wrote, or None when there is none (yet)."""
    try:
        return SupervisorStatus.model_validate_json(read_bytes(path, STATE_MAX_BYTES))
    except (OSError, ValueError):
        return None  # none, or not one a supervisor wrote (a FIFO, a folder, huge, damaged)


STATUS_FILE_MODE = 0o644
"""`epycctl status` is for every user; the unit's UMask=0077 would make the file root's."""


def write_status(path: Path | None, status: SupervisorStatus) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(status.model_dump_json(indent=2) + "\n", encoding="utf-8")
    partial.chmod(STATUS_FILE_MODE)
    partial.replace(path)
