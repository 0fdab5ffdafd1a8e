"""Where each endpoint stands between its endpoint file, its approval and its installed units.

- pending-approval: an endpoint file, no approval.
- approved: the approval's fingerprint is the current plan's, and the units on disk are the
  approved units byte for byte.
- changed-needs-approval: the plan's fingerprint moved (endpoint file, model revision,
  data/, image, host), or the installed units are not the approved ones; with readable
  diffs. Installed units are never rewritten here: only a new approval does that.
- orphaned: an approval or installed units, and no endpoint file.
- damaged: the approval record cannot be read (cut short, not UTF-8, not an approval's
  shape); `epycctl approve NAME` replaces it, `epycctl remove NAME` deletes it. Only that
  endpoint is affected: the others are read as usual.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import BaseModel, Field

from epycd.approval.install import pending_transactions
from epycd.approval.record import Approval, approved_names, load_approval, sha256_text
from epycd.errors import InputError
from epycd.names import UNIT_PREFIX, is_endpoint_name, unit_name
from epycd.plan.endpoint import Plan
from epycd.plan.problem import Problem
from epycd.readfile import RECORD_MAX_BYTES, read_bytes
from epycd.settings import Settings

if TYPE_CHECKING:
    from epycd.plan.pipeline.result import EndpointResult

StateName = Literal["pending-approval", "approved", "changed-needs-approval", "orphaned", "damaged"]

VOLATILE_PLAN_KEYS = frozenset({"fingerprint", "units", "unit_dirs"})
VOLATILE_DECISION_KEYS = frozenset({"warnings", "socket_reason"})
VOLATILE_MEMORY_KEYS = frozenset({"available_gb"})


class Unplanned(BaseModel):
    """An endpoint file that does not plan now: its errors, and when the only reason is the
    memory free now, the inputs fingerprint of what would have been planned."""

    errors: list[Problem]
    unfit_inputs_fingerprint: str | None = None
    unreadable_here: str | None = None


CurrentPlan: TypeAlias = Plan | Unplanned
"""What an endpoint file plans to now: its plan, or why it has none."""


class EndpointState(BaseModel):
    endpoint: str
    state: StateName
    fingerprint: str | None = Field(default=None, description="the current plan's")
    approved_fingerprint: str | None = None
    approved_by: str | None = None
    approved_at: datetime | None = None
    reasons: list[str] = Field(default_factory=list)
    plan_diff: str = Field(default="", description="unified diff, approved -> current plan")
    units_diff: str = Field(default="", description="unified diff, approved -> current units")
    interrupted: bool = Field(default=False, description="an install or remove was cut short")


def comparable_plan(plan: Plan) -> dict[str, Any]:
    """The plan's JSON without what moves on its own (busy %, available memory, wording),
    its decisions on the top level, as the diff has always shown them."""
    shown = plan.decisions.unit_decisions
    kept = shown.model_dump(mode="json", exclude=set(VOLATILE_DECISION_KEYS))
    kept |= plan.model_dump(mode="json", exclude={"decisions", *VOLATILE_PLAN_KEYS})
    memory = kept.get("memory")  # an Instinct endpoint's fit is `gpu_fit`; a set's, its members'
    if isinstance(memory, dict):
        kept["memory"] = {k: v for k, v in memory.items() if k not in VOLATILE_MEMORY_KEYS}
    return kept


def plan_diff(approved: Plan, current: Plan) -> str:
    def lines(plan: Plan) -> list[str]:
        text = json.dumps(comparable_plan(plan), indent=2, sort_keys=True, default=str)
        return text.splitlines(keepends=True)

    diff = difflib.unified_diff(
        lines(approved), lines(current), "approved plan", "current plan", n=1
    )
    return "".join(diff)


def units_diff(
    approved: Mapping[str, str | None],
    current: Mapping[str, str | None],
    labels: tuple[str, str] = ("approved", "current"),
) -> str:
    parts: list[str] = []
    for name in sorted(set(approved) | set(current)):
        old, new = approved.get(name), current.get(name)
        if old == new:
            continue
        parts.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                f"{labels[0]}/{name}" if old is not None else "/dev/null",
                f"{labels[1]}/{name}" if new is not None else "/dev/null",
            )
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in parts)


def unit_drift(approval: Approval, installed: Mapping[str, str | None]) -> list[str]:
    """Approved unit files missing or modified on disk."""
    drift = []
    for name, record in approval.units.items():
        text = installed.get(name)
        if text is None:
            drift.append(f"{name} is missing from {Path(record.path).parent}")
        elif sha256_text(text) != record.sha256:
            drift.append(f"{name} was modified after approval")
    return drift


def approved_inputs(approval: Approval) -> str:
    """The approved plan's inputs fingerprint (its full fingerprint for older records)."""
    return approval.plan.inputs_fingerprint or approval.fingerprint


def _without_current_plan(
    state: EndpointState,
    approval: Approval,
    errors: Sequence[str],
    unfit_inputs_fingerprint: str | None,
    unreadable_here: str | None,
) -> None:
    """An approved endpoint whose file does not plan now: drift, unless only this user or
    only the memory free now stands in the way."""
    if unreadable_here is not None:
        state.reasons.append(
            f"this user cannot read {unreadable_here} (root-only), so no plan is made "
            "here to compare with: the approved plan is shown; run status as root to "
            "compare"
        )
    elif unfit_inputs_fingerprint == approved_inputs(approval):
        state.reasons.append(
            "a plan made now does not fit the memory free now (a running endpoint holds "
            "its own); nothing else changed, so the approved units stay"
        )
    else:
        state.state = "changed-needs-approval"
        state.reasons.extend(f"the endpoint no longer plans: {e}" for e in errors)


def _against_current_plan(state: EndpointState, approval: Approval, plan: Plan) -> None:
    """Drift when the shaping inputs moved; figures read at plan time alone are not."""
    if approved_inputs(approval) != (plan.inputs_fingerprint or plan.fingerprint):
        state.state = "changed-needs-approval"
        state.reasons.append(
            f"the plan changed since approval ({approval.fingerprint[:12]} -> "
            f"{plan.fingerprint[:12]}): `epycctl approve {state.endpoint}` to apply it"
        )
        state.plan_diff = plan_diff(approval.plan, plan)
        state.units_diff = units_diff(approval.approved_units(), dict(plan.units))
    elif plan.fingerprint != approval.fingerprint:
        state.reasons.append(
            "a plan made now differs only in figures read at plan time (socket load, free "
            "memory); the approved units stay as approved"
        )


def _against_installed_units(
    state: EndpointState, approval: Approval, installed: Mapping[str, str | None]
) -> None:
    drift = unit_drift(approval, installed)
    if drift:
        state.state = "changed-needs-approval"
        state.reasons.append("installed units differ from the approved ones: " + "; ".join(drift))
        if not state.units_diff:
            state.units_diff = units_diff(
                approval.approved_units(), installed, ("approved", "installed")
            )


def _new_state(
    name: str, plan: Plan | None, approval: Approval | None, interrupted: bool
) -> EndpointState:
    """Pending approval, with the current plan's fingerprint and who approved what, when."""
    state = EndpointState(
        endpoint=name,
        state="pending-approval",
        fingerprint=plan.fingerprint if plan else None,
        interrupted=interrupted,
    )
    if approval is not None:
        state.approved_fingerprint = approval.fingerprint
        state.approved_by = approval.approver.describe()
        state.approved_at = approval.approved_at
    return state


def _not_approved(
    state: EndpointState, errors: Sequence[str], installed: Mapping[str, str | None]
) -> None:
    name = state.endpoint
    present = {k: v for k, v in installed.items() if v is not None}
    state.reasons.extend(errors or ["not approved yet: `epycctl approve " + name + "`"])
    if present:
        state.reasons.append(f"unit files on disk without an approval: {sorted(present)}")


def endpoint_state(
    name: str,
    *,
    has_endpoint_file: bool,
    plan: Plan | None,
    errors: Sequence[str] = (),
    unfit_inputs_fingerprint: str | None = None,
    unreadable_here: str | None = None,
    approval: Approval | None,
    installed: Mapping[str, str | None],
    interrupted: bool = False,
) -> EndpointState:
    """The state of one endpoint. Pure: the caller reads the files (`read_installed`)."""
    state = _new_state(name, plan, approval, interrupted)
    if not has_endpoint_file:
        state.state = "orphaned"
        state.reasons.append(f"no endpoint file for {name}: `epycctl remove {name}` cleans up")
    elif approval is None:
        _not_approved(state, errors, installed)
    else:
        state.state = "approved"
        if plan is None:
            _without_current_plan(
                state, approval, errors, unfit_inputs_fingerprint, unreadable_here
            )
        else:
            _against_current_plan(state, approval, plan)
        _against_installed_units(state, approval, installed)
    if interrupted:
        state.reasons.append(
            f"an install or remove of {name} was interrupted: `epycctl approve {name}` or "
            "`epycctl remove` finishes it"
        )
    return state


def read_text(path: Path) -> str | None:
    """An installed unit file's text, None when missing; one that cannot be read (a FIFO, a
    folder, over `RECORD_MAX_BYTES`) reads as a line saying so, which differs from any unit."""
    try:
        return read_bytes(path, RECORD_MAX_BYTES).decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"(unreadable: {exc.strerror or exc})\n"


def read_installed(approval: Approval) -> dict[str, str | None]:
    """Approved unit file name -> its text on disk now (None when missing)."""
    return {name: read_text(Path(rec.path)) for name, rec in approval.units.items()}


def endpoint_unit_files(settings: Settings, name: str) -> list[Path]:
    """Unit files on disk named after the endpoint (epyc-llm-NAME.*), approved or not."""
    stem = unit_name(name)
    found: list[Path] = []
    for folder in sorted({settings.unit_dir, settings.quadlet_dir}):
        if folder.is_dir():
            found += [
                p for p in folder.iterdir() if p.is_file() and p.name.rsplit(".", 1)[0] == stem
            ]
    return found


def installed_endpoint_names(settings: Settings, approved_paths: set[str]) -> set[str]:
    """Endpoint names of epyc-llm-NAME.service/.container files no approval lists (files
    whose NAME cannot be an endpoint's are not the product's)."""
    names: set[str] = set()
    for folder in {settings.unit_dir, settings.quadlet_dir}:
        if folder.is_dir():
            for path in folder.glob(f"{UNIT_PREFIX}*.*"):
                if path.suffix in {".service", ".container"} and str(path) not in approved_paths:
                    names.add(path.name.removeprefix(UNIT_PREFIX).rsplit(".", 1)[0])
    return {name for name in names if is_endpoint_name(name)}


def _load_approvals(settings: Settings) -> tuple[dict[str, Approval | None], dict[str, str]]:
    """Every approval record, and apart the ones that cannot be read (their error), so that
    one damaged record does not hide the state of the other endpoints."""
    approvals: dict[str, Approval | None] = {}
    unreadable: dict[str, str] = {}
    for name in approved_names(settings):
        try:
            approvals[name] = load_approval(settings, name)
        except InputError as exc:
            unreadable[name] = str(exc)
    return approvals, unreadable


def unplanned_errors(current: CurrentPlan | None) -> list[str]:
    if isinstance(current, Unplanned):
        return [problem.text for problem in current.errors]
    return []


def endpoint_states(settings: Settings, planned: Mapping[str, CurrentPlan]) -> list[EndpointState]:
    """The state of every endpoint: those with a file (`planned`: name -> its plan or its
    errors) and those with only an approval or installed units left (orphaned)."""
    interrupted = set(pending_transactions(settings))
    approvals, unreadable = _load_approvals(settings)
    approved_paths = {r.path for a in approvals.values() if a for r in a.units.values()}
    names = set(planned) | set(approvals) | installed_endpoint_names(settings, approved_paths)
    states = []
    names |= set(unreadable)
    for name in sorted(names):
        current = planned.get(name)
        if name in unreadable:
            states.append(_damaged(name, current, unreadable[name], name in interrupted))
        else:
            approval = approvals.get(name)
            states.append(_state_of(settings, name, current, approval, name in interrupted))
    return states


def _damaged(
    name: str, current: CurrentPlan | None, unreadable: str, interrupted: bool
) -> EndpointState:
    return EndpointState(
        endpoint=name,
        state="damaged",
        fingerprint=current.fingerprint if isinstance(current, Plan) else None,
        reasons=[unreadable],
        interrupted=interrupted,
    )


def _state_of(
    settings: Settings,
    name: str,
    current: CurrentPlan | None,
    approval: Approval | None,
    interrupted: bool,
) -> EndpointState:
    """`endpoint_state` of NAME with the files read: the approved units, or any unit files
    named after it when it has no approval."""
    installed = (
        read_installed(approval)
        if approval
        else {p.name: read_text(p) for p in endpoint_unit_files(settings, name)}
    )
    return endpoint_state(
        name,
        has_endpoint_file=current is not None,
        plan=current if isinstance(current, Plan) else None,
        errors=unplanned_errors(current),
        unfit_inputs_fingerprint=(
            current.unfit_inputs_fingerprint if isinstance(current, Unplanned) else None
        ),
        unreadable_here=current.unreadable_here if isinstance(current, Unplanned) else None,
        approval=approval,
        installed=installed,
        interrupted=interrupted,
    )


def unplanned(result: EndpointResult) -> Unplanned:
    return Unplanned(
        errors=list(result.errors),
        unfit_inputs_fingerprint=result.unfit_inputs_fingerprint,
        unreadable_here=result.unreadable_here,
    )


def endpoint_states_of(
    settings: Settings, results: Sequence[EndpointResult]
) -> list[EndpointState]:
    """`endpoint_states` from the planner's `plan_all` results."""
    planned: dict[str, CurrentPlan] = {
        r.endpoint: r.plan if r.plan is not None else unplanned(r) for r in results
    }
    return endpoint_states(settings, planned)
