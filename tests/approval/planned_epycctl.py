"""The real `epycctl` with the planner's answer taken from $EPYCD_TEST_PLAN_FILE.

    python -m tests.approval.planned_epycctl approve NAME --yes ...

Why it exists: the approval layer (record, install, drift, boot check, isolation between
endpoints) must be tested against plans the planner gives only on particular hosts and
files: a plan with errors, one that needs confirmation, one that does not fit, extra units,
two endpoints on chosen sockets and ports. `tests/approval/plans.py` makes such plans from a
real detection of a fake host root; this module hands them to the real CLI in place of
`epycd.cli.approve.current_plan`. Everything after planning is the product's own code.
The same flow from a real endpoint file through the real planner is covered by
tests/approval/test_real_planner.py and tests/quickstart.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import epycd.cli.approve as approve_cli
from epycd.cli import main
from epycd.errors import InputError
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from epycd.settings import Settings
from tests.approval.plans import PLAN_FILE_ENV

MODULE = "tests.approval.planned_epycctl"


def planned(settings: Settings, name: str) -> tuple[EndpointResult, HostFacts]:
    """What `current_plan` answers, read from the plan file `ApprovalSandbox.set_plans` wrote."""
    data = json.loads(Path(os.environ[PLAN_FILE_ENV]).read_text())
    if name not in data["plans"]:
        raise InputError("no such endpoint file", file=settings.config_dir / f"{name}.toml")
    plan = Plan.model_validate(data["plans"][name])
    result = EndpointResult(endpoint=name, config_file=plan.decisions.config_file, plan=plan)
    return result, HostFacts.model_validate(data["host"])


def replace_planner() -> None:
    """Point the approve command at `planned`; fail loudly if the seam moved, since the
    tests would otherwise run the real planner on hand-made endpoint files."""
    if not callable(getattr(approve_cli, "current_plan", None)):
        raise SystemExit("epycd.cli.approve.current_plan is gone: update planned_epycctl.py")
    approve_cli.current_plan = planned


if __name__ == "__main__":
    replace_planner()
    main(sys.argv[1:], prog_name="epycctl")
