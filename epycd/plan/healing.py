"""How an endpoint's units come back by themselves (docs/healing.md): the figures of its
`Healing`, from the endpoint file's `restart`, the unit's start budget and whether epycd's
supervisor is the unit's main process.

One rule for every unit epycd writes: systemd restarts a unit that failed (or whose watchdog
fired) after `RESTART_SEC`; `CRASH_LOOP_RUNS` failed runs within an interval long enough for
that many starts at the full start budget are a crash loop. epycd's crash recorder
(`python -m epycd.approval.crashloop`, the units' `ExecStopPost=`) counts the runs and keeps
a crash-looping endpoint down, across a reboot too; systemd's own start limit, set a little
above it by the renderer, is only the backstop.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Restart = Literal["no", "on-failure"]


class Healing(BaseModel):
    """How an endpoint's units come back by themselves (docs/healing.md): systemd restarts a
    unit that failed or whose watchdog fired, after `restart_sec`; `start_limit_burst` failed
    runs within `start_limit_interval_s` make a crash loop, which keeps the unit down (across a
    reboot too) until `epycctl start NAME`."""

    model_config = ConfigDict(frozen=True)

    restart: Restart = Field(description='Restart=: "on-failure" unless the file says "no"')
    restart_sec: int = Field(description="RestartSec=: the pause before a restart")
    start_limit_burst: int = Field(
        description="failed runs within the interval that end in the crash-loop state"
    )
    start_limit_interval_s: int = Field(
        description="StartLimitIntervalSec=: long enough for that many starts at the full "
        "start budget, so a model that fails late in its start still counts"
    )
    watchdog_s: int | None = Field(
        description="WatchdogSec= of a unit whose main process is epycd's supervisor (host, "
        "docker): it pings while /health answers and the engine is not stalled; None where "
        "podman's health check kills the container instead (HealthOnFailure=kill)"
    )
    stall_s: int = Field(
        description="the engine counts as hung when requests are running and no prompt or "
        "generation token was counted for this long"
    )
    restart_clean_exit: bool = Field(
        default=False,
        description="RestartForceExitStatus=0: a main process that exits 0 by itself is "
        "restarted too, where no supervisor makes that exit a failure (podman: vLLM in its "
        "container exits 0 when its EngineCore dies); False in approvals made before it",
    )


RESTART_SEC = 5
"""RestartSec=: long enough for the old process's port, memory and container name to be
released (and for the journal to show one failure before the next start), short next to a
model's load: an endpoint whose engine died is back within its start-up and 15 s."""

CRASH_LOOP_RUNS = 3
"""Failed runs within the interval that make a crash loop: one failure is an accident (an
OOM kill, a hung engine), a second may be one too, a third in a row is the endpoint itself."""

INTERVAL_MARGIN_S = 60
"""Added to the interval: the recorder's own time and systemd's between the runs."""

WATCHDOG_S = 30
"""WatchdogSec= of a unit whose main process is epycd's supervisor: it pings while vLLM's
/health answers and the engine is not stalled; 30 s is three of its checks, so one slow
answer never kills a serving engine."""

STALL_S = 120
"""The engine counts as hung when requests are running and no prompt or generation token
was counted for this long (the supervisor's `--stall-timeout`): longer than any one step of
a CPU engine under load (a long prompt's prefill on one socket), short next to a client's
patience."""

READY_MARGIN_S = 60
"""Beyond an instance's start budget and pause: the balancer's ready check, HAProxy's start."""


def balancer_start_s(instance_start_s: int) -> int:
    """TimeoutStartSec= of a multi-instance endpoint's HAProxy: its ready check waits for an
    instance still starting or restarting (epycd.approval.ready), so one instance's start
    budget and pause, and a margin."""
    return instance_start_s + RESTART_SEC + READY_MARGIN_S


def start_limit_interval_s(start_timeout_s: int, runs: int = CRASH_LOOP_RUNS) -> int:
    """StartLimitIntervalSec=: `runs` starts at the full start budget, each after the pause,
    and the margin, so that a model which fails late in its load still counts as a loop."""
    return runs * (start_timeout_s + RESTART_SEC) + INTERVAL_MARGIN_S


def healing_for(restart: Restart, start_timeout_s: int, supervised: bool) -> Healing:
    """An endpoint unit's healing. `supervised`: its main process is epycd's supervisor (the
    host and docker paths), which pings systemd's watchdog; on podman (Quadlet) the main
    process is podman, and podman's health check kills a container that stops answering,
    and a clean exit of podman (vLLM's, when its EngineCore died) restarts the unit too: the
    supervisor makes that exit a failure itself."""
    return Healing(
        restart=restart,
        restart_sec=RESTART_SEC,
        start_limit_burst=CRASH_LOOP_RUNS,
        start_limit_interval_s=start_limit_interval_s(start_timeout_s),
        watchdog_s=WATCHDOG_S if supervised else None,
        stall_s=STALL_S,
        restart_clean_exit=not supervised,
    )


def balancer_healing(restart: Restart, instance_start_s: int) -> Healing:
    """The HAProxy unit of a multi-instance endpoint: the same rule on its own start budget
    (`balancer_start_s`), and no watchdog (HAProxy does not ping it)."""
    return healing_for(restart, balancer_start_s(instance_start_s), supervised=False)
