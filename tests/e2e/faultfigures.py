"""Figures of the fault e2e runs (docs/healing.md), from the records the machines wrote: what the
tests assert on and what benchmarks/faults.py reports. Pure functions of those records."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

WATCHDOG_S = 30
"""WatchdogSec= of a supervised unit (epycd.plan.healing)."""
SLACK_S = 15
"""An endpoint whose server died is ready again within its start-up + 15 s (+ WATCHDOG_S for
a hung one): the start-up of the run that replaced it, measured by its supervisor (the one
before it is reported beside it; on a shared 2-core machine two starts differ by more)."""


def healing_problem(figures: EngineFault, hung: bool) -> str | None:
    """Why the fault's figures miss the healing bound, or None."""
    if figures.to_ready_s is None:
        return "not ready again"
    bound = SLACK_S + (WATCHDOG_S if hung else 0)
    if figures.overhead_s is None or figures.overhead_s > bound:
        return f"healing took {figures.overhead_s} s over the new start-up, more than {bound} s"
    if int(figures.restarts or 0) < 1:
        return "systemd restarted nothing (NRestarts)"
    return None


class Window(BaseModel):
    seconds: float
    requests: int
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return round(self.tokens / self.seconds, 1) if self.seconds > 0 else 0.0


class LoadedKill(BaseModel):
    """One instance of a set killed under load (tests/e2e/inside_instances.py kill_under_load);
    times in seconds from the kill."""

    startup_before_s: float
    to_degraded_s: float | None
    to_ready_s: float | None
    requests: int
    failed: int
    failed_in_flight: int = 0
    """Failed requests that were already sent when the kill came."""
    failed_after_kill: list[float]
    """Start times (from the kill) of failed requests sent after it."""
    before: Window
    degraded: Window
    after: Window
    restarts: str


def _window(requests: list[dict[str, Any]], start: float, end: float) -> Window:
    done = [r for r in requests if r.get("ok") and start <= r["end"] < end]
    return Window(
        seconds=round(end - start, 2),
        requests=len(done),
        tokens=sum(int(r.get("tokens", 0)) for r in done),
    )


def loaded_kill(record: dict[str, Any]) -> LoadedKill:
    killed = float(record["killed_at"])
    samples = [s for s in record["samples"] if s["t"] > killed]
    down = next((s for s in samples if s["state"] != "ready"), None)
    ready = next(
        (s for s in samples if down and s["t"] > down["t"] and s["state"] == "ready"), None
    )
    requests = record["requests"]
    failed = [r for r in requests if not r.get("ok")]
    return LoadedKill(
        startup_before_s=float(record["startup_before"]),
        to_degraded_s=round(down["t"] - killed, 2) if down else None,
        to_ready_s=round(ready["t"] - killed, 2) if ready else None,
        requests=len(requests),
        failed=len(failed),
        failed_in_flight=sum(1 for r in failed if r["start"] < killed),
        failed_after_kill=[round(r["start"] - killed, 2) for r in failed if r["start"] >= killed],
        before=_window(requests, float(record["loaded_at"]), killed),
        degraded=_window(requests, killed, ready["t"] if ready else float(record["ready_at"])),
        after=_window(
            requests,
            ready["t"] if ready else float(record["ready_at"]),
            float(record["stopped_at"]),
        ),
        restarts=str(record.get("restarts", "")),
    )


class EngineFault(BaseModel):
    """A signal to a ready endpoint's engine (tests/e2e/inside.py engine_fault)."""

    signal: str
    startup_before_s: float
    """The start-up (the supervisor's gate) of the run the signal hit."""
    startup_after_s: float | None
    """The start-up of the run that replaced it."""
    to_ready_s: float | None
    """From the signal to the new run's READY."""
    restarts: str

    @property
    def overhead_s(self) -> float | None:
        """What healing added to the new run's own start-up: noticing, stopping the old run,
        the recorder, RestartSec=, the approval check, the supervisor's start."""
        if self.to_ready_s is None or self.startup_after_s is None:
            return None
        return round(self.to_ready_s - self.startup_after_s, 2)


def engine_fault(record: dict[str, Any]) -> EngineFault:
    after = record.get("status_after") or {}
    seconds = after.get("seconds") or {}
    return EngineFault(
        signal=record["signal"],
        startup_before_s=float(record["startup_before"]),
        startup_after_s=round(sum(seconds.values()), 2) if seconds else None,
        to_ready_s=record.get("seconds_to_ready"),
        restarts=str(record.get("NRestarts", "")),
    )


class CrashLoop(BaseModel):
    """A model whose weights are broken (tests/e2e/inside.py phase_stopped_reboot)."""

    runs: int
    seconds_to_crash_loop: float | None
    state: str | None
    runs_after_reboot: int | None = None
