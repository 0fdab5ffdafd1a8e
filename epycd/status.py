"""Where each endpoint stands at run time, and the recipe's hand-off for a ready one.

The approval layer says whether an endpoint is pending, approved, changed or orphaned
(`epycd.approval.state`). Here that is combined with what systemd says about its unit
(`systemctl show`), with what its supervisor last wrote (`RUN_DIR/NAME.json`) and with the
admin's stop marker (`STATE_DIR/stopped/NAME.json`) into one of:

    pending-approval, approved (installed, not started), starting, ready, failed:PHASE,
    stopped (by the admin), changed-needs-approval, orphaned, damaged (its approval record)

`endpoint_status` and `handoff` are pure; the `read_*`/`collect_status` functions at the end
are the edges that read those files and ask systemctl (one call for every unit).
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from epycd.approval.record import Approval, readable_approval
from epycd.approval.state import EndpointState, Unplanned, endpoint_states, unplanned
from epycd.listen import DEFAULT_HOST, local_url
from epycd.plan.model import Plan
from epycd.settings import Settings
from epycd.supervisor import SupervisorStatus, read_status

if TYPE_CHECKING:
    from epycd.plan.build import EndpointResult

STOPPED = "stopped"
"""The state name; the marker files live where `stop_marker_path` says."""
UNIT_PREFIX = "epyc-llm-"
SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "UnitFileState")
STARTING_UNIT_STATES = frozenset({"activating", "reloading"})
HANDOFF_MAX_TOKENS = 128
COUNT_WORDS = (
    ("ready", "ready"),
    ("starting", "starting"),
    ("failed", "failed"),
    ("approved", "not started"),
    ("stopped", "stopped"),
    ("pending-approval", "needs approval"),
    ("changed-needs-approval", "changed, needs approval"),
    ("orphaned", "orphaned"),
    ("damaged", "damaged"),
)


class UnitState(BaseModel):
    """What `systemctl show` says about one unit; "unknown" when systemd could not answer."""

    unit: str
    load: str = "unknown"
    active: str = "unknown"
    sub: str = ""
    result: str = ""
    unit_file: str = ""

    @property
    def known(self) -> bool:
        return self.active != "unknown" and self.load != "not-found"


class StopMarker(BaseModel):
    """`epycctl stop NAME` was run: keep the endpoint down until `epycctl start NAME`."""

    endpoint: str
    by: str
    at: datetime


class Handoff(BaseModel):
    """The recipe's last step: everything a caller needs to use a ready endpoint."""

    base_url: str = Field(description="with the trailing /v1")
    served_model_name: str
    endpoint: str = Field(description="/v1/chat/completions or /v1/completions")
    why: str
    runtime: str
    port: int
    host: str = Field(default=DEFAULT_HOST, description="the address the endpoint listens on")
    api_key_file: str | None = Field(
        default=None, description="the file holding the API key clients send; never the key"
    )
    threads: int
    kv_cache_gb: int | None
    max_model_len: int | None
    socket: int | None
    numa_nodes: list[int]
    cpus: str
    stop: str
    curl: str
    python: str


class EndpointStatus(BaseModel):
    """One row of `epycctl status --json` (keys are stable)."""

    name: str
    state: str = Field(
        description="pending-approval, approved, starting, ready, failed:PHASE, "
        "stopped, changed-needs-approval, orphaned or damaged"
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
    primary_endpoint: str | None = None
    approved_by: str | None = None
    stopped_by: str | None = None
    log_tail: list[str] = Field(default_factory=list)
    diff: str | None = Field(default=None, description="approved -> current plan and units")
    handoff: Handoff | None = None

    @property
    def kind(self) -> str:
        """The state without its phase: failed:health -> failed."""
        return self.state.split(":", 1)[0]


def main_unit(name: str, approval: Approval | None = None) -> str:
    """The unit systemd runs for the endpoint (Quadlet generates NAME.service too)."""
    return f"{approval.unit_name if approval else UNIT_PREFIX + name}.service"


def base_url(port: int, host: str = DEFAULT_HOST) -> str:
    return f"{local_url(host, port)}/v1"


def parse_show(text: str) -> dict[str, UnitState]:
    """`systemctl show -p Id,... A B` output: one block per unit, blank-line separated."""
    states: dict[str, UnitState] = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        unit = fields.get("Id")
        if not unit:
            continue
        states[unit] = UnitState(
            unit=unit,
            load=fields.get("LoadState") or "unknown",
            active=fields.get("ActiveState") or "unknown",
            sub=fields.get("SubState", ""),
            result=fields.get("Result", ""),
            unit_file=fields.get("UnitFileState", ""),
        )
    return states


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
) -> EndpointStatus:
    """One endpoint's run-time state. Pure.

    What runs is the approved plan, so its columns come from the approval; the current
    plan only for an endpoint not approved yet.
    """
    shown = approval.plan if approval is not None else current_plan
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
    if state.state != "approved":
        status.reason = status.reasons[0] if status.reasons else ""
        return status
    if stopped is not None:
        status.state = STOPPED
        status.reason = f"stopped by {stopped.by} at {stopped.at:%Y-%m-%d %H:%M:%S %Z}"
        if unit.active in {"active", "activating"}:
            status.reason += f"; but {unit.unit} is {unit.active}"
        return status
    state_name, phase, reason, tail = runtime_state(unit, supervisor)
    status.state, status.phase, status.reason, status.log_tail = state_name, phase, reason, tail
    status.reasons = [] if state_name != "approved" else status.reasons
    if state_name == "ready" and approval is not None:
        status.handoff = handoff(approval.plan)
    return status


def primary_path(primary: str) -> str:
    return "/v1/chat/completions" if primary == "chat_completions" else "/v1/completions"


def ready_curl(url: str, served: str, primary: str, key_file: str | None = None) -> str:
    body: dict[str, Any] = {"model": served}
    if primary == "chat_completions":
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello, world"
    body |= {"max_tokens": HANDOFF_MAX_TOKENS, "temperature": 0.7}
    auth = f'-H "Authorization: Bearer $(cat {shlex.quote(key_file)})" ' if key_file else ""
    return (
        f"curl -s {url}{primary_path(primary).removeprefix('/v1')} {auth}"
        f"-H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"
    )


def openai_example(url: str, served: str, primary: str, key_file: str | None = None) -> str:
    if key_file:
        key = f"open({key_file!r}).read().strip()"
        head = f"from openai import OpenAI\n\nclient = OpenAI(base_url={url!r}, api_key={key})\n"
    else:
        head = (
            "from openai import OpenAI\n\n"
            f'client = OpenAI(base_url={url!r}, api_key="EMPTY")  # any non-empty key\n'
        )
    if primary == "chat_completions":
        call = (
            "r = client.chat.completions.create(\n"
            f"    model={served!r},\n"
            '    messages=[{"role": "user", "content": "Hello"}],\n'
            f"    max_tokens={HANDOFF_MAX_TOKENS}, temperature=0.7,\n"
            ")\n"
            "print(r.choices[0].message.content)\n"
        )
    else:
        call = (
            f'r = client.completions.create(model={served!r}, prompt="Hello, world", '
            f"max_tokens={HANDOFF_MAX_TOKENS})\n"
            "print(r.choices[0].text)\n"
        )
    return head + call


def cpu_count(cpus: str) -> int:
    from epycd.host.cpulist import parse_cpulist

    return len(parse_cpulist(cpus)) if cpus else 0


def handoff(plan: Plan) -> Handoff:
    """The hand-off of a ready endpoint, from its approved plan. Pure."""
    url = base_url(plan.port, plan.host)
    key_file = plan.api_key_file
    served, primary = plan.served_model_name or plan.model, plan.primary_endpoint
    if primary == "chat_completions":
        why = "the model has a chat template: chat messages on /v1/chat/completions"
    else:
        why = "the model has no chat template: raw prompts on /v1/completions"
    return Handoff(
        base_url=url,
        served_model_name=served,
        endpoint=primary_path(primary),
        why=why,
        runtime=plan.runtime,
        port=plan.port,
        host=plan.host,
        api_key_file=key_file,
        threads=cpu_count(plan.omp_cpus),
        kv_cache_gb=plan.kv_cache_gb,
        max_model_len=plan.max_model_len,
        socket=plan.socket,
        numa_nodes=list(plan.numa_nodes),
        cpus=plan.cpus,
        stop=f"epycctl stop {plan.endpoint}",
        curl=ready_curl(url, served, primary, key_file),
        python=openai_example(url, served, primary, key_file),
    )


def counts_text(statuses: Iterable[EndpointStatus]) -> str:
    """ "2 ready, 1 needs approval, 1 failed" for sd_notify's STATUS=."""
    counts = Counter(status.kind for status in statuses)
    parts = [f"{counts[kind]} {word}" for kind, word in COUNT_WORDS if counts[kind]]
    return ", ".join(parts) if parts else "no endpoints"


def status_json(statuses: Sequence[EndpointStatus]) -> dict[str, Any]:
    return {"endpoints": [status.model_dump(mode="json") for status in statuses]}


# --- edges: the files and systemctl -------------------------------------------------


def stop_marker_path(settings: Settings, name: str) -> Path:
    """The path the boot-time approval check also reads (one definition, there)."""
    from epycd.approval.check import stop_marker

    return stop_marker(settings, name)


def stop_markers_dir(settings: Settings) -> Path:
    return stop_marker_path(settings, "-").parent


def read_stop_marker(settings: Settings, name: str) -> StopMarker | None:
    path = stop_marker_path(settings, name)
    try:
        return StopMarker.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return StopMarker(
            endpoint=name, by=f"unknown (unreadable marker {path})", at=datetime.now(UTC)
        )


def supervisor_status_file(settings: Settings, plan: Plan | None, name: str) -> Path:
    given = plan.status_file if plan else None
    return Path(given) if given else settings.run_dir / f"{name}.json"


def read_unit_states(units: Sequence[str]) -> dict[str, UnitState]:
    """One `systemctl show` for every unit; all "unknown" when systemd cannot answer."""
    from epycd import systemd

    unknown = {unit: UnitState(unit=unit) for unit in units}
    if not units:
        return unknown
    try:
        text = systemd.run(
            "systemctl",
            ["show", "--property=" + ",".join(SHOW_PROPERTIES), *units],
            timeout=systemd.QUERY_TIMEOUT_S,
        ).stdout
    except systemd.SystemdError:
        return unknown
    return unknown | {unit: state for unit, state in parse_show(text).items() if unit in unknown}


def collect_status(
    settings: Settings,
    planned: Mapping[str, Plan | Unplanned | Sequence[str]],
    unit_states: Mapping[str, UnitState] | None = None,
) -> list[EndpointStatus]:
    """Every endpoint's status: `planned` is name -> current plan or its errors (every
    endpoint file); approvals and installed units add the orphaned ones."""
    states = endpoint_states(settings, planned)
    approvals = {state.endpoint: readable_approval(settings, state.endpoint) for state in states}
    units = {name: main_unit(name, approval) for name, approval in approvals.items()}
    if unit_states is None:
        unit_states = read_unit_states(sorted(units.values()))
    statuses = []
    for state in states:
        name, approval = state.endpoint, approvals[state.endpoint]
        current = planned.get(name)
        current_plan = current if isinstance(current, Plan) else None
        shown = approval.plan if approval else current_plan
        statuses.append(
            endpoint_status(
                state,
                approval=approval,
                current_plan=current_plan,
                unit=unit_states.get(units[name]) or UnitState(unit=units[name]),
                supervisor=read_supervisor(supervisor_status_file(settings, shown, name)),
                stopped=read_stop_marker(settings, name),
            )
        )
    return statuses


def read_supervisor(path: Path) -> SupervisorStatus | None:
    try:
        return read_status(path)
    except OSError:
        return None


def planned_map(results: Sequence[EndpointResult]) -> dict[str, Plan | Unplanned | Sequence[str]]:
    return {r.endpoint: r.plan if r.plan is not None else unplanned(r) for r in results}
