"""The approval record holds the approved plan as a typed `Plan`: it round-trips through the
record's JSON unchanged, and one that lacks a field it needs is damaged. Records written
before a field existed are tests/approval/test_migrate.py's, on stored records of every era."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from epycd.approval.record import (
    Approval,
    Approver,
    approval_path,
    load_approval,
)
from epycd.approval.workflow import make_approval
from epycd.atomic import write_atomic
from epycd.errors import InputError
from epycd.plan.endpoint import Plan
from tests.approval.conftest import ApprovalSandbox
from tests.render.fixtures import CASES, as_plan, units_of

APPROVER = Approver(uid=0, user="root", sudo_uid=1000, sudo_user="alice")


def rendered_plan(case: str, env: ApprovalSandbox) -> Plan:
    decisions = CASES[case]()
    config_file = str(env.settings.config_dir / f"{decisions.endpoint}.toml")
    return as_plan(decisions, units=units_of(decisions), config_file=config_file)


def write_record(env: ApprovalSandbox, plan: Plan) -> Approval:
    approval = make_approval(
        env.settings,
        plan,
        env.host(),
        APPROVER,
        accepted_unvalidated=False,
        now=datetime(2026, 11, 30, tzinfo=UTC),
    )
    path = approval_path(env.settings, plan.endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, approval.model_dump_json(indent=2).encode())
    return approval


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_plan_comes_back_from_its_record_unchanged(env: ApprovalSandbox, case: str) -> None:
    plan = rendered_plan(case, env)
    write_record(env, plan)
    loaded = load_approval(env.settings, plan.endpoint)
    assert loaded is not None
    assert isinstance(loaded.plan, Plan)
    assert loaded.plan == plan
    assert loaded.approved_units() == plan.units


def test_a_record_whose_plan_lacks_a_needed_field_is_damaged(env: ApprovalSandbox) -> None:
    plan = rendered_plan("genoa-podman", env)
    path = approval_path(env.settings, write_record(env, plan).endpoint)
    record = json.loads(path.read_text())
    del record["plan"]["decisions"]["port"]
    path.write_text(json.dumps(record))
    with pytest.raises(InputError, match="damaged approval record"):
        load_approval(env.settings, plan.endpoint)


def test_the_approved_plan_is_frozen() -> None:
    plan = as_plan(CASES["genoa-podman"]())
    with pytest.raises(ValueError, match="frozen"):
        plan.decisions.port = 1  # type: ignore[misc]
