"""Two approvals never share a port or a CPU: `approve` checks the other approvals under the
state lock, right before it installs, so that also two racing `approve` commands cannot
both win. Plans here are given (planned_epycctl.py) so that they can clash on purpose."""

from __future__ import annotations

import subprocess
import sys

from epycd.approval.record import load_approval
from tests.approval.conftest import ApprovalSandbox
from tests.approval.planned_epycctl import MODULE as PLANNED_EPYCCTL
from tests.approval.plans import make_plan, write_plan_file
from tests.sandbox import REPO


def test_a_plan_on_an_approved_endpoints_port_or_cpus_is_refused(env: ApprovalSandbox) -> None:
    host, config = env.host(), env.settings.config_dir
    env.set_plans(make_plan("a", host, config, socket=0, port=8000))
    assert env.epycctl("approve", "a", "--yes", "--no-start").returncode == 0

    for clash, plan in {
        "port 8000": make_plan("b", host, config, socket=1, port=8000),
        "CPUs 0-95": make_plan("b", host, config, socket=0, port=8001),
    }.items():
        env.set_plans(env.plans["a"], plan)
        done = env.epycctl("approve", "b", "--yes", "--no-start")
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"b's plan uses {clash} of approved endpoint a; nothing was written" in done.stderr
        assert load_approval(env.settings, "b") is None
        assert not (env.settings.unit_dir / "epyc-llm-b.service").exists()

    env.set_plans(env.plans["a"], make_plan("b", host, config, socket=1, port=8001))
    assert env.epycctl("approve", "b", "--yes", "--no-start").returncode == 0


def test_two_racing_approvals_of_the_same_port_cannot_both_win(env: ApprovalSandbox) -> None:
    host, config = env.host(), env.settings.config_dir
    env.set_plans(
        make_plan("a", host, config, socket=0, port=8000),
        make_plan("b", host, config, socket=1, port=8000),
    )
    write_plan_file(env.plan_file, env.plans, host)
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", PLANNED_EPYCCTL, "approve", name, "--yes", "--no-start"],
            env=env.environ(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outcomes = {}
    for name, racer in zip(("a", "b"), racers, strict=True):
        _out, err = racer.communicate(timeout=120)
        outcomes[name] = (racer.returncode, err)
    assert sorted(code for code, _ in outcomes.values()) == [0, 1], outcomes
    [loser] = [name for name, (code, _) in outcomes.items() if code == 1]
    assert "uses port 8000 of approved endpoint" in outcomes[loser][1]
    assert load_approval(env.settings, loser) is None
