"""The run-time state of a multi-instance endpoint (docs/instances.md): each instance's unit
and supervisor, and the endpoint's state from them and its balancer's.

The balancer up and every instance ready is "ready"; the balancer up with an instance not
ready is "degraded" (HAProxy's health check has taken that instance out, the others serve;
below `min_ready` ready instances the reason says so); the balancer up with no instance
ready is "failed:instances" (nothing serves). An instance whose unit is in a crash loop
(`epycd.approval.crashloop`) is "crash-loop": it stays down until `epycctl start NAME`.
Pure: `epycd.status.collect` reads the unit states, status files and crash records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from pydantic import BaseModel, Field

from epycd.approval.crashloop import CRASH_LOOP, CrashRecord, Failure, recent, verdict_text
from epycd.plan.endpoint import Plan
from epycd.status.units import UnitState
from epycd.supervisor import SupervisorStatus

DEGRADED = "degraded"
NO_INSTANCE = "failed:instances"

RuntimeState = Callable[
    [UnitState, SupervisorStatus | None], tuple[str, str | None, str, list[str]]
]


class InstanceStatus(BaseModel):
    """One instance of a multi-instance endpoint, in `epycctl status --json`."""

    instance: int
    unit: str
    state: str
    phase: str | None = None
    reason: str = ""
    port: int
    cpus: str
    numa_nodes: list[int]
    restarts: int = Field(default=0, description="failed runs within the start limit interval")
    last_failure: Failure | None = None
    socket: int | None = None
    ready_since: datetime | None = None
    startup_seconds: float | None = None


class InstanceLoad(BaseModel):
    """One instance's live load (`load` in `epycctl status --json`), from the last minute of
    its /metrics that epycd keeps (`epycd.metrics.load`)."""

    instance: int
    running: float = Field(description="requests in the engine's batch")
    waiting: float = Field(description="requests queued for the batch")
    kv_cache_usage: float | None = Field(
        description="fraction of the KV cache pool in use, 0 to 1; null for a server that "
        "does not export it"
    )
    tokens_per_second: float | None = Field(
        description="prompt + generation tokens per second over the window; null with one "
        "reading so far"
    )
    window_seconds: float = Field(description="the span of the readings behind tokens/s")


def readiness(supervisor: SupervisorStatus) -> tuple[datetime | None, float | None]:
    """When a ready supervisor became ready, and how long its start-up took."""
    try:
        since: datetime | None = datetime.fromisoformat(supervisor.since)
    except ValueError:
        since = None
    seconds = round(sum(supervisor.seconds.values()), 3) if supervisor.seconds else None
    return since, seconds


def member_units(plan: Plan | None) -> list[str]:
    """The instances' services, for `systemctl show` (Quadlet names them the same)."""
    if plan is None or plan.instance_set is None:
        return []
    return [f"{member.unit_name}.service" for member in plan.decisions.members]


def instance_statuses(
    plan: Plan,
    units: Mapping[str, UnitState],
    supervisors: Mapping[str, SupervisorStatus | None],
    runtime_state: RuntimeState,
    crashes: Mapping[str, CrashRecord | None] | None = None,
    now: datetime | None = None,
) -> list[InstanceStatus]:
    assert plan.instance_set is not None
    out = []
    for member in plan.decisions.members:
        unit = f"{member.unit_name}.service"
        state, phase, reason, _ = runtime_state(
            units.get(unit) or UnitState(unit=unit), supervisors.get(unit)
        )
        record = (crashes or {}).get(member.unit_name)
        if record is not None and record.verdict is not None:
            state, phase, reason = CRASH_LOOP, None, verdict_text(plan.endpoint, record.verdict)
        failures = recent(record, member.healing, now) if now is not None else []
        supervisor = supervisors.get(unit)
        since, seconds = readiness(supervisor) if state == "ready" and supervisor else (None, None)
        out.append(
            InstanceStatus(
                instance=member.instance or 0,
                unit=unit,
                state=state,
                phase=phase,
                reason=reason,
                port=member.port,
                cpus=member.cpus,
                numa_nodes=member.numa_nodes,
                restarts=len(failures),
                last_failure=record.failures[-1] if record and record.failures else None,
                socket=member.socket,
                ready_since=since,
                startup_seconds=seconds,
            )
        )
    return out


def set_state(plan: Plan, balancer_state: str, instances: list[InstanceStatus]) -> tuple[str, str]:
    """(state, reason) of the endpoint from its balancer's state and its instances'."""
    assert plan.instance_set is not None
    ready = [i for i in instances if i.state == "ready"]
    if balancer_state != "ready" or len(ready) == len(instances):
        return balancer_state, ""
    down = ", ".join(f"{i.instance} ({i.state})" for i in instances if i.state != "ready")
    reason = f"{len(ready)} of {len(instances)} instances ready"
    if not ready:
        return NO_INSTANCE, (
            f"{reason}, fewer than min_ready = {plan.instance_set.min_ready}: the balancer has "
            f"nothing to send requests to; instance(s) {down}"
        )
    reason += f"; the balancer sends nothing to instance(s) {down}"
    if len(ready) < plan.instance_set.min_ready:
        reason += f"; fewer than min_ready = {plan.instance_set.min_ready}"
    return DEGRADED, reason
