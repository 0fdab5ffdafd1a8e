"""Where each endpoint stands at run time: the approval state (`epycd.approval.state`)
combined with its unit's state, its supervisor's last word and the admin's stop marker
into one of

    pending-approval, approved (installed, not started), starting, ready, failed:PHASE,
    stopped (by the admin), changed-needs-approval, orphaned, damaged (its approval record),
    install-interrupted (an install or remove journal left behind, which the boot check
    refuses to start on: approve again or remove),
    crash-loop (its unit failed `start_limit_burst` runs within the start limit interval,
    epycd.approval.crashloop: down, across reboots too, until `epycctl start NAME`),
    degraded (a multi-instance endpoint whose balancer serves with an instance down,
    epycd.status.instances), failed:instances (its balancer up with no instance ready),
    idle (an on-demand endpoint whose socket waits for a request, its engine stopped: not
    started since boot, stopped after its idle time, or by another of its swap group)

and, beside the state, the failed runs its units had within the start limit interval
(`restarts`, each one systemd restarted) and the last of them (`last_failure`).

Pure: `epycd.status.collect` reads the files and asks systemctl.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from epycd.approval.crashloop import (
    CRASH_LOOP,
    CrashRecord,
    Failure,
    Verdict,
    recent,
    unit_stems,
    verdict_text,
)
from epycd.approval.record import Approval
from epycd.approval.state import EndpointState
from epycd.plan.endpoint import Plan
from epycd.status.handoff import Handoff, base_url, handoff
from epycd.status.instances import (
    DEGRADED,
    NO_INSTANCE,
    InstanceLoad,
    InstanceStatus,
    instance_statuses,
    readiness,
    set_state,
)
from epycd.status.stop import STOPPED, StopMarker
from epycd.status.units import STARTING_UNIT_STATES, UnitState
from epycd.supervisor import SupervisorStatus

IDLE = "idle"
COUNT_WORDS = (
    ("ready", "ready"),
    (DEGRADED, "degraded"),
    ("starting", "starting"),
    (IDLE, "idle"),
    ("failed", "failed"),
    (CRASH_LOOP, "in a crash loop"),
    ("approved", "not started"),
    ("stopped", "stopped"),
    ("pending-approval", "needs approval"),
    ("changed-needs-approval", "changed, needs approval"),
    ("orphaned", "orphaned"),
    ("damaged", "damaged"),
    ("install-interrupted", "install interrupted"),
)
INTERRUPTED = "install-interrupted"
SERVING = frozenset({"ready", "degraded"})
"""The states in which an endpoint answers requests."""
AVAILABLE = SERVING | {IDLE}
"""The states of an endpoint that answers a request (an idle one after a cold start)."""
NOT_HEALTHY = "not healthy: "
"""How the reason of a ready endpoint whose supervisor stopped pinging the watchdog begins."""


class ColdStarts(BaseModel):
    """An on-demand endpoint's cold starts since boot (`SupervisorStatus.ready_runs`)."""

    model_config = ConfigDict(frozen=True)

    count: int = 0
    seconds: float = Field(default=0.0, description="their start-ups, summed (as measured)")


class EndpointStatus(BaseModel):
    """One row of `epycctl status --json` (keys are stable)."""

    name: str
    state: str = Field(
        description="pending-approval, approved, starting, ready, failed:PHASE, "
        "stopped, changed-needs-approval, orphaned, damaged, install-interrupted, crash-loop, "
        "degraded, idle"
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
    kv_cache_gb: int | float | None = Field(
        default=None,
        description="GiB, as the engine sizes its KV pool (whole GiB for vLLM, else to 0.01)",
    )
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
    restarts: int = Field(
        default=0,
        description="failed runs of its units within the start limit interval (systemd "
        "restarts each one until the crash loop)",
    )
    last_failure: Failure | None = Field(
        default=None, description="the last failed run of its units: when, how, why"
    )
    crash_loop: Verdict | None = Field(
        default=None, description="state crash-loop: since, failures, the last, its first error"
    )
    ready_since: datetime | None = Field(
        default=None, description="state ready: when its supervisor saw it ready"
    )
    startup_seconds: float | None = Field(
        default=None, description="state ready: its last start-up, the health gate's phases"
    )
    load: list[InstanceLoad] = Field(
        default_factory=list,
        description="ready or degraded: each instance's live load, from the daemon (epycd)",
    )
    cold_starts: ColdStarts | None = Field(
        default=None,
        description="an on-demand endpoint: its starts that passed the gate since boot, and "
        "their start-ups, from its supervisor's file (none without a supervisor: podman 5)",
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
        "model": plan.decisions.model,
        "served_model_name": plan.decisions.served_model_name,
        "port": plan.decisions.port,
        "socket": plan.decisions.socket,
        "cpus": plan.decisions.cpus,
        "numa_nodes": plan.decisions.numa_nodes,
        "kv_cache_gb": plan.decisions.kv_cache_gb,
        "max_model_len": plan.decisions.max_model_len,
        "url": base_url(plan.decisions.port, plan.decisions.host),
        "runtime": plan.decisions.runtime,
        "image": plan.decisions.image,
        "primary_endpoint": plan.decisions.primary_endpoint,
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
    crashes: Mapping[str, CrashRecord | None] | None = None,
    now: datetime | None = None,
    socket: UnitState | None = None,
) -> EndpointStatus:
    """One endpoint's run-time state. Pure.

    What runs is the approved plan, so its columns come from the approval; the current
    plan only for an endpoint not approved yet. `crashes` is unit stem -> its crash record
    and `now` the time the failed runs are counted back from; `socket` an on-demand
    endpoint's socket unit.
    """
    shown = approval.plan if approval is not None else current_plan
    status = _recorded_status(state, shown, unit, stopped)
    status.image_digest = approval.image_digest if approval is not None else None
    if shown is not None and shown.decisions.on_demand is not None and supervisor is not None:
        status.cold_starts = ColdStarts(
            count=supervisor.ready_runs, seconds=supervisor.ready_seconds
        )
    if approval is not None and now is not None:
        _set_failures(status, approval.plan, crashes or {}, now)
    if state.interrupted:
        _set_interrupted(status, state)
        return status
    if state.state != "approved":
        status.reason = status.reasons[0] if status.reasons else ""
        return status
    record = (crashes or {}).get(approval.plan.unit_name) if approval is not None else None
    if record is not None and record.verdict is not None:
        status.state, status.phase, status.reasons = CRASH_LOOP, None, []
        status.reason = verdict_text(state.endpoint, record.verdict)
        status.crash_loop = record.verdict
        return status
    if stopped is not None:
        _set_stopped(status, stopped, unit)
        return status
    state_name, phase, reason, tail = runtime_state(unit, supervisor)
    status.state, status.phase, status.reason, status.log_tail = state_name, phase, reason, tail
    status.reasons = [] if state_name != "approved" else status.reasons
    if state_name == "approved" and socket is not None and socket.active == "active":
        _set_idle(status, approval)
    if state_name == "ready" and supervisor is not None:
        status.ready_since, status.startup_seconds = readiness(supervisor)
    if state_name == "ready" and supervisor is not None and supervisor.unhealthy:
        status.reason = (
            f"{NOT_HEALTHY}{supervisor.unhealthy}; systemd's watchdog restarts it unless it "
            "recovers"
        )
    if approval is not None and approval.plan.instance_set is not None:
        _set_status(
            status, approval.plan, members or {}, member_supervisors or {}, crashes or {}, now
        )
    if status.state == "ready" and approval is not None:
        status.handoff = handoff(approval.plan)
    return status


def _set_idle(status: EndpointStatus, approval: Approval | None) -> None:
    """An on-demand endpoint whose socket listens and whose engine does not run."""
    on_demand = approval.plan.decisions.on_demand if approval is not None else None
    if on_demand is None:
        return
    status.state, status.phase, status.reasons = IDLE, None, []
    status.reason = (
        f"its socket holds port {status.port}; the first request starts the engine (stopped "
        f"after {on_demand.idle_stop_s} s with no connection, or not started since boot)"
    )
    others = [n for n in on_demand.swap_group if n != status.name]
    if others:
        status.reason += f"; swaps with {', '.join(others)}"


def _set_failures(
    status: EndpointStatus, plan: Plan, crashes: Mapping[str, CrashRecord | None], now: datetime
) -> None:
    """`restarts` and `last_failure` over every unit of the endpoint (a set's instances)."""
    members = {m.unit_name: m for m in plan.decisions.members}
    failures: list[Failure] = []
    last: list[Failure] = []
    for stem in unit_stems(plan):
        record = crashes.get(stem)
        healing = members[stem].healing if stem in members else plan.decisions.healing
        failures += recent(record, healing or plan.decisions.healing, now)
        if record is not None and record.failures:
            last.append(record.failures[-1])
    status.restarts = len(failures)
    status.last_failure = max(last, key=lambda failure: failure.at) if last else None


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
    crashes: Mapping[str, CrashRecord | None],
    now: datetime | None,
) -> None:
    """A multi-instance endpoint: its instances, and "degraded" when one is not ready (or
    "failed:instances" when none is)."""
    status.balancer = status.unit_state
    status.instances = instance_statuses(
        plan, members, supervisors, runtime_state, crashes=crashes, now=now
    )
    state, reason = set_state(plan, status.state, status.instances)
    if state in {DEGRADED, NO_INSTANCE}:
        status.state, status.reason = state, reason
        status.phase = "instances" if state == NO_INSTANCE else status.phase


def counts_text(statuses: Iterable[EndpointStatus]) -> str:
    """ "2 ready, 1 needs approval, 1 failed" for sd_notify's STATUS=."""
    counts = Counter(status.kind for status in statuses)
    parts = [f"{counts[kind]} {word}" for kind, word in COUNT_WORDS if counts[kind]]
    return ", ".join(parts) if parts else "no endpoints"


def status_json(statuses: Sequence[EndpointStatus]) -> dict[str, Any]:
    return {"endpoints": [status.model_dump(mode="json") for status in statuses]}
