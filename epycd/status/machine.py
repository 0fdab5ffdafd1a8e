"""Where each endpoint stands at run time: the approval state (`epycd.approval.state`)
combined with its unit's state, its supervisor's last word and the admin's stop marker
into one of

    pending-approval, approved (installed, not started), starting, ready, failed:PHASE,
    stopped (by the admin), changed-needs-approval, orphaned, damaged (its approval record),
    install-interrupted (an install or remove journal left behind, which the boot check
    refuses to start on: approve again or remove),
    degraded (a multi-instance endpoint whose balancer serves with an instance down,
    epycd.status.instances)

Pure: `epycd.status.collect` reads the files and asks systemctl.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from epycd.approval.record import Approval
from epycd.approval.state import EndpointState
from epycd.plan.model import Plan
from epycd.status.handoff import Handoff, base_url, handoff
from epycd.status.instances import DEGRADED, InstanceStatus, instance_statuses, set_state
from epycd.status.stop import STOPPED, StopMarker
from epycd.status.units import STARTING_UNIT_STATES, UnitState
from epycd.supervisor import SupervisorStatus

COUNT_WORDS = (
    ("ready", "ready"),
    (DEGRADED, "degraded"),
    ("starting", "starting"),
    ("failed", "failed"),
    ("approved", "not started"),
    ("stopped", "stopped"),
    ("pending-approval", "needs approval"),
    ("changed-needs-approval", "changed, needs approval"),
    ("orphaned", "orphaned"),
    ("damaged", "damaged"),
    ("install-interrupted", "install interrupted"),
)
INTERRUPTED = "install-interrupted"


class EndpointStatus(BaseModel):
    """One row of `epycctl status --json` (keys are stable)."""

    name: str
    state: str = Field(
        description="pending-approval, approved, starting, ready, failed:PHASE, "
        "stopped, changed-needs-approval, orphaned, damaged or install-interrupted"
    )
    phase: str | None = None
    reason: str = ""
    reasons: list[str] = Field(default_factory=list)
    model: str | None = None
    served_model_name: str | None = None
    port: int | None = None
    socket: int | None = None
    cpus: str | None = None
    numa_nodes: list[int] = Field(default_factory=list)
    kv_cache_gb: int | None = None
    max_model_len: int | None = None
    url: str | None = Field(default=None, description="base URL with /v1")
    unit: str
    unit_state: str = "unknown"
    runtime: str | None = None
    image: str | None = Field(default=None, description="a container endpoint's image")
    image_digest: str | None = Field(
        default=None,
        description="the approved image as the engine held it at approve time (sha256:...); "
        "null when unknown",
    )
    primary_endpoint: str | None = None
    approved_by: str | None = None
    stopped_by: str | None = None
    log_tail: list[str] = Field(default_factory=list)
    diff: str | None = Field(default=None, description="approved -> current plan and units")
    handoff: Handoff | None = None
    instances: list[InstanceStatus] = Field(
        default_factory=list, description="a multi-instance endpoint: each instance"
    )
    balancer: str | None = Field(
        default=None, description="a multi-instance endpoint: the balancer's unit state"
    )

    @property
    def kind(self) -> str:
        """The state without its phase: failed:health -> failed."""
        return self.state.split(":", 1)[0]


def described_plan(plan: Plan | None) -> dict[str, Any]:
    """The columns status shows, from a plan (the approved one, or the current)."""
    if plan is None:
        return {}
    return {
        "model": plan.model,
        "served_model_name": plan.served_model_name,
        "port": plan.port,
        "socket": plan.socket,
        "cpus": plan.cpus,
        "numa_nodes": plan.numa_nodes,
        "kv_cache_gb": plan.kv_cache_gb,
        "max_model_len": plan.max_model_len,
        "url": base_url(plan.port, plan.host),
        "runtime": plan.runtime,
        "image": plan.image,
        "primary_endpoint": plan.primary_endpoint,
    }


def runtime_state(
    unit: UnitState, supervisor: SupervisorStatus | None
) -> tuple[str, str | None, str, list[str]]:
    """(state, phase, reason, log tail) of an approved, undrifted, not stopped endpoint."""
    said = supervisor.state if supervisor else None
    if unit.known:
        if unit.active == "active":
            return "ready", "serving", "", []
        if unit.active in STARTING_UNIT_STATES:
            phase = supervisor.phase if supervisor and said == "starting" else unit.sub
            return "starting", phase, f"unit {unit.active} ({unit.sub})", []
        if unit.active == "failed":
            if supervisor and said == "failed":
                phase = supervisor.phase or "unknown"
                return f"failed:{phase}", phase, supervisor.reason, supervisor.log_tail
            reason = f"the unit failed before the health gate (systemd result: {unit.result})"
            return "failed:start", "start", reason, []
        if unit.active == "deactivating":
            return "approved", None, "the unit is stopping", []
        return "approved", None, "installed, not started", []
    if supervisor and said in {"starting", "ready", "failed"}:
        if said == "failed":
            phase = supervisor.phase or "unknown"
            return f"failed:{phase}", phase, supervisor.reason, supervisor.log_tail
        return str(said), supervisor.phase, "systemd did not answer; from the supervisor", []
    if unit.load == "not-found":
        return "approved", None, f"systemd does not know {unit.unit} (daemon-reload?)", []
    return "approved", None, "installed; systemd did not answer", []


def endpoint_status(
    state: EndpointState,
    *,
    approval: Approval | None,
    current_plan: Plan | None,
    unit: UnitState,
    supervisor: SupervisorStatus | None,
    stopped: StopMarker | None,
    members: Mapping[str, UnitState] | None = None,
    member_supervisors: Mapping[str, SupervisorStatus | None] | None = None,
) -> EndpointStatus:
    """One endpoint's run-time state. Pure.

    What runs is the approved plan, so its columns come from the approval; the current
    plan only for an endpoint not approved yet.
    """
    shown = approval.plan if approval is not None else current_plan
    status = _recorded_status(state, shown, unit, stopped)
    status.image_digest = approval.image_digest if approval is not None else None
    if state.interrupted:
        _set_interrupted(status, state)
        return status
    if state.state != "approved":
        status.reason = status.reasons[0] if status.reasons else ""
        return status
    if stopped is not None:
        _set_stopped(status, stopped, unit)
        return status
    state_name, phase, reason, tail = runtime_state(unit, supervisor)
    status.state, status.phase, status.reason, status.log_tail = state_name, phase, reason, tail
    status.reasons = [] if state_name != "approved" else status.reasons
    if approval is not None and approval.plan.instances is not None:
        _set_status(status, approval.plan, members or {}, member_supervisors or {})
    if status.state == "ready" and approval is not None:
        status.handoff = handoff(approval.plan)
    return status


def _recorded_status(
    state: EndpointState, shown: Plan | None, unit: UnitState, stopped: StopMarker | None
) -> EndpointStatus:
    """The status the approval state says, before the stop marker and the supervisor."""
    status = EndpointStatus(
        name=state.endpoint,
        state=state.state,
        unit=unit.unit,
        unit_state=unit.active
        if unit.known
        else unit.load
        if unit.load != "unknown"
        else "unknown",
        reasons=list(state.reasons),
        approved_by=state.approved_by,
        stopped_by=stopped.by if stopped else None,
        **described_plan(shown),
    )
    if state.state == "changed-needs-approval":
        status.diff = (state.plan_diff + state.units_diff) or None
    if state.state in {"changed-needs-approval", "orphaned", "damaged"} and unit.active == "active":
        status.reasons.append(f"{unit.unit} is running the approved units")
    return status


def _set_interrupted(status: EndpointStatus, state: EndpointState) -> None:
    """The approval state's `interrupted` (the install journal the boot check refuses on)."""
    name = state.endpoint
    status.state = INTERRUPTED
    status.reason = (
        f"an install or remove of {name} was interrupted; its unit does not start until it is "
        f"finished: `epycctl approve {name}` again, or `epycctl remove {name}`"
    )
    status.reasons = [r for r in status.reasons if "was interrupted" not in r]


def _set_stopped(status: EndpointStatus, stopped: StopMarker, unit: UnitState) -> None:
    status.state = STOPPED
    status.reason = f"stopped by {stopped.by} at {stopped.at:%Y-%m-%d %H:%M:%S %Z}"
    if unit.active in {"active", "activating"}:
        status.reason += f"; but {unit.unit} is {unit.active}"


def _set_status(
    status: EndpointStatus,
    plan: Plan,
    members: Mapping[str, UnitState],
    supervisors: Mapping[str, SupervisorStatus | None],
) -> None:
    """A multi-instance endpoint: its instances, and "degraded" when one is not ready."""
    status.balancer = status.unit_state
    status.instances = instance_statuses(plan, members, supervisors, runtime_state)
    state, reason = set_state(plan, status.state, status.instances)
    if state == DEGRADED:
        status.state, status.reason = state, reason


def counts_text(statuses: Iterable[EndpointStatus]) -> str:
    """ "2 ready, 1 needs approval, 1 failed" for sd_notify's STATUS=."""
    counts = Counter(status.kind for status in statuses)
    parts = [f"{counts[kind]} {word}" for kind, word in COUNT_WORDS if counts[kind]]
    return ", ".join(parts) if parts else "no endpoints"


def status_json(statuses: Sequence[EndpointStatus]) -> dict[str, Any]:
    return {"endpoints": [status.model_dump(mode="json") for status in statuses]}
