"""Run the real `epycctl` with the planner replaced by the plans in $EPYCD_TEST_PLAN_FILE
(used until the tests can plan from endpoint files; everything after planning is real).

    python -m tests.approval.driver approve NAME --yes ...
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
from epycd.plan.build import EndpointResult
from epycd.plan.model import Plan
from epycd.settings import Settings
from tests.approval.plans import PLAN_FILE_ENV


def planned(settings: Settings, name: str) -> tuple[EndpointResult, HostFacts]:
    data = json.loads(Path(os.environ[PLAN_FILE_ENV]).read_text())
    if name not in data["plans"]:
        raise InputError("no such endpoint file", file=settings.config_dir / f"{name}.toml")
    plan = Plan.model_validate(data["plans"][name])
    result = EndpointResult(endpoint=name, config_file=plan.config_file, plan=plan)
    return result, HostFacts.model_validate(data["host"])


if __name__ == "__main__":
    approve_cli.current_plan = planned
    main(sys.argv[1:], prog_name="epycctl")
