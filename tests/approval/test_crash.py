"""A SIGKILL at every step of an install (and a remove) leaves the old or the new units and
approval, never a partial file; the next run finishes or undoes the cut-short one."""

from __future__ import annotations

import signal

import pytest

from epycd.approval.check import check_problems
from epycd.approval.install import STEPS
from epycd.approval.record import load_approval
from epycd.approval.state import endpoint_states
from epycd.plan.endpoint import Plan
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan

TIMER = "epyc-llm-chat-warm.timer"
COMMITTED = STEPS[STEPS.index("journaled") :]


def timer_text(minutes: int) -> str:
    return f"[Timer]\nOnBootSec={minutes}min\n[Install]\nWantedBy=timers.target\n"


def on_disk(env: ApprovalSandbox, plan: Plan) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in plan.units:
        path = env.settings.unit_dir / name
        out[name] = path.read_text() if path.exists() else None
    return out


@pytest.mark.parametrize("step", STEPS)
def test_kill_during_install(env: ApprovalSandbox, step: str) -> None:
    host = env.host()
    config = env.settings.config_dir
    old = make_plan("chat", host, config, port=8000, extra_units={TIMER: timer_text(1)})
    new = make_plan("chat", host, config, port=8100, extra_units={TIMER: timer_text(2)})
    other = make_plan("other", host, config, socket=1, port=8001)
    env.set_plans(old, other)
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0

    env.set_plans(new, other)
    killed = env.epycctl("approve", "chat", "--yes", "--no-start", EPYCD_TEST_CRASH_AT=step)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    # Right after the kill: every file whole, either the old or the new one.
    units = on_disk(env, new)
    for name, text in units.items():
        assert text in (old.units[name], new.units[name]), name
    approval = load_approval(env.settings, "chat")
    assert approval is not None and approval.fingerprint in (old.fingerprint, new.fingerprint)
    all_old = units == dict(old.units) and approval.fingerprint == old.fingerprint
    all_new = units == dict(new.units) and approval.fingerprint == new.fingerprint
    if step in ("unit-staged", "approval-staged"):
        assert all_old
    if step == "done":
        assert all_new
    # ... and never started on a mix: the boot check refuses anything but a whole set.
    problems = check_problems(env.settings, "chat", host)
    assert (problems == []) == (
        (all_old or all_new) and step in ("unit-staged", "approval-staged", "done")
    ), problems
    # status reports a cut-short install
    [state] = [s for s in endpoint_states(env.settings, env.plans) if s.endpoint == "chat"]
    journaled = step in COMMITTED and step != "done"
    assert state.interrupted == journaled

    # The next run (approving another endpoint) finishes or undoes it.
    nxt = env.epycctl("approve", "other", "--yes", "--no-start")
    assert nxt.returncode == 0, nxt.stderr
    assert ("repaired:" in nxt.stdout) == (step != "done")
    expected = new if step in COMMITTED else old
    assert on_disk(env, new) == dict(expected.units)
    approval = load_approval(env.settings, "chat")
    assert approval is not None and approval.fingerprint == expected.fingerprint
    assert check_problems(env.settings, "chat", host) == []
    assert list(env.tmp.rglob("*epycd-staged")) == []
    assert not (env.settings.state_dir / "transactions" / "chat.json").exists()


def test_kill_during_remove(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    plan = make_plan("chat", host, config, extra_units={TIMER: timer_text(1)})
    env.set_plans(plan, make_plan("other", host, config, socket=1, port=8001))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0

    killed = env.epycctl("remove", "chat", "--yes", "--no-stop", EPYCD_TEST_CRASH_AT="journaled")
    assert killed.returncode == -signal.SIGKILL
    assert load_approval(env.settings, "chat") is not None
    assert check_problems(env.settings, "chat", host) != []  # interrupted: do not start

    assert env.epycctl("approve", "other", "--yes", "--no-start").returncode == 0
    assert load_approval(env.settings, "chat") is None
    assert on_disk(env, plan) == dict.fromkeys(plan.units)
