"""The approval tests' sandbox: the real CLI on a fake host root, planning replaced by
hand-made plans (tests/approval/plans.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import Plan
from tests.approval.planned_epycctl import MODULE as PLANNED_EPYCCTL
from tests.approval.plans import PLAN_FILE_ENV, write_plan_file
from tests.hosts import make_host
from tests.sandbox import CliSandbox


@dataclass
class ApprovalSandbox(CliSandbox):
    """A `CliSandbox` on a fake Genoa host root whose `epycctl` plans nothing itself: it
    approves the hand-made plans of `set_plans` (tests/approval/planned_epycctl.py)."""

    plan_file: Path = Path()
    plans: dict[str, Plan] = field(default_factory=dict)
    cli_module: str = PLANNED_EPYCCTL

    def host(self, root: Path | None = None) -> HostFacts:
        return detect_host(root or self.host_root, probe_runtimes=False)

    def set_plans(self, *plans: Plan) -> None:
        self.plans = {plan.endpoint: plan for plan in plans}
        for plan in plans:
            Path(plan.decisions.config_file).write_text(f'model = "{plan.decisions.model}"\n')
        write_plan_file(self.plan_file, self.plans, self.host())

    def environ(self, *, system_path: bool = True, **extra: str) -> dict[str, str]:
        return (
            super().environ(system_path=system_path, **{PLAN_FILE_ENV: str(self.plan_file)}) | extra
        )


def make_env(base: Path, monkeypatch: pytest.MonkeyPatch) -> ApprovalSandbox:
    sandbox = CliSandbox.create(base)
    env = ApprovalSandbox(
        tmp=base, vars=sandbox.vars, bin_dir=sandbox.bin_dir, plan_file=base / "plans.json"
    )
    env.vars["EPYCD_HOST_ROOT"] = str(make_host(base / "hosts", "genoa-9654-2s-nps1"))
    for name, value in env.vars.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EPYCD_ADMIN_GROUP", raising=False)
    return env


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    yield make_env(tmp_path, monkeypatch)
