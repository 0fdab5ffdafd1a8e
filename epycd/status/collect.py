"""The edges of status: every endpoint's approval, current plan, unit state (one
`systemctl show` for all), supervisor file, stop marker and its units' crash records
(`STATE_DIR/crashloop/UNIT.json`), read and combined by `epycd.status.machine`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from epycd.approval.crashloop import CrashRecord, read_crash_record, unit_stems
from epycd.approval.record import readable_approval
from epycd.approval.state import CurrentPlan, endpoint_states, unplanned
from epycd.plan.endpoint import Plan
from epycd.render.on_demand import socket_file
from epycd.settings import Settings
from epycd.status.instances import member_units
from epycd.status.machine import EndpointStatus, endpoint_status
from epycd.status.stop import read_stop_marker
from epycd.status.units import UnitState, main_unit, read_unit_states
from epycd.supervisor import SupervisorStatus, read_status

if TYPE_CHECKING:
    from epycd.plan.pipeline.result import EndpointResult


def supervisor_status_file(settings: Settings, plan: Plan | None, name: str) -> Path:
    given = plan.decisions.status_file if plan else None
    return Path(given) if given else settings.run_dir / f"{name}.json"


def collect_status(
    settings: Settings,
    planned: Mapping[str, CurrentPlan],
    unit_states: Mapping[str, UnitState] | None = None,
) -> list[EndpointStatus]:
    """Every endpoint's status: `planned` is name -> current plan or its errors (every
    endpoint file); approvals and installed units add the orphaned ones."""
    states = endpoint_states(settings, planned)
    approvals = {state.endpoint: readable_approval(settings, state.endpoint) for state in states}
    units = {name: main_unit(name, approval) for name, approval in approvals.items()}
    members = {
        name: member_units(approval.plan if approval else None)
        for name, approval in approvals.items()
    }
    sockets = {
        name: socket_file(name)
        for name, approval in approvals.items()
        if approval is not None and approval.plan.decisions.on_demand is not None
    }
    if unit_states is None:
        every = [*units.values(), *(unit for names in members.values() for unit in names)]
        every += sockets.values()
        unit_states = read_unit_states(sorted(every))
    statuses = []
    now = datetime.now(UTC)
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
                members=unit_states,
                member_supervisors=member_supervisors(approval.plan if approval else None),
                crashes=crash_records(settings, approval.plan if approval else None),
                now=now,
                socket=unit_states.get(sockets[name]) if name in sockets else None,
            )
        )
    return statuses


def crash_records(settings: Settings, plan: Plan | None) -> dict[str, CrashRecord | None]:
    """Unit stem -> its crash record, for every unit of an approved endpoint."""
    if plan is None:
        return {}
    return {stem: read_crash_record(settings, stem) for stem in unit_stems(plan)}


def member_supervisors(plan: Plan | None) -> dict[str, SupervisorStatus | None]:
    """A multi-instance endpoint: each instance's service -> its supervisor's status file."""
    if plan is None or plan.instance_set is None:
        return {}
    return {
        f"{m.unit_name}.service": read_supervisor(Path(m.status_file)) if m.status_file else None
        for m in plan.decisions.members
    }


def read_supervisor(path: Path) -> SupervisorStatus | None:
    try:
        return read_status(path)
    except OSError:
        return None


def planned_map(results: Sequence[EndpointResult]) -> dict[str, CurrentPlan]:
    return {r.endpoint: r.plan if r.plan is not None else unplanned(r) for r in results}
