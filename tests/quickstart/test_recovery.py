"""quickstart recovers an interrupted install at the same point `approve` does: first, before
it plans, so that the plan sees the finished approval (its socket and port stay its own)."""

from __future__ import annotations

import signal

from epycd.approval.install import CRASH_ENV, journal_path
from epycd.approval.record import load_approval
from tests.sandbox import CliSandbox, run_python

INTERRUPTED_APPROVE = """
from epycd.approval.record import current_approver
from epycd.approval.workflow import install_approval, make_approval
from epycd.host.detect import detect_host
from epycd.settings import load_settings
from tests.approval.plans import make_plan

settings = load_settings()
host = detect_host(settings.host_root, probe_runtimes=False)
plan = make_plan("chat", host, settings.config_dir)
approval = make_approval(settings, plan, host, current_approver(), accepted_unvalidated=False)
install_approval(settings, approval)
"""


def test_an_interrupted_install_is_finished_before_quickstart_plans(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    killed = run_python(
        ["-c", INTERRUPTED_APPROVE], env=sandbox.environ() | {CRASH_ENV: "journaled"}, timeout=120
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert journal_path(sandbox.settings, "chat").exists()

    done = sandbox.epycctl("quickstart", "--yes", system_path=False)

    assert done.returncode == 1 and "no runtime to serve with" in done.stderr
    assert "repaired: chat: finished an interrupted install" in done.stdout
    assert not journal_path(sandbox.settings, "chat").exists()
    approval = load_approval(sandbox.settings, "chat")
    assert approval is not None and approval.endpoint == "chat"
