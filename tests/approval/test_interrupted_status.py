"""`epycctl status` shows an endpoint whose install was cut short (its journal left behind,
which the boot check refuses to start on) as install-interrupted, with the fix."""

from __future__ import annotations

import json
import signal

from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan


def test_status_shows_an_interrupted_install_with_the_fix(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    old = make_plan("chat", host, config)
    new = make_plan("chat", host, config, port=8001)
    env.set_plans(old)
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    env.set_plans(new)
    killed = env.epycctl("approve", "chat", "--yes", "--no-start", EPYCD_TEST_CRASH_AT="journaled")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    shown = env.epycctl("status", "chat", "--json")
    [status] = json.loads(shown.stdout)["endpoints"]
    assert status["state"] == "install-interrupted", status
    assert "`epycctl approve chat` again, or `epycctl remove chat`" in status["reason"]

    table = env.epycctl("status")
    assert table.returncode == 0, table.stderr
    assert "install-interrupted" in table.stdout and "epycctl remove chat" in table.stdout

    refused = env.epycctl("start", "chat")
    assert refused.returncode == 1 and "install-interrupted" in refused.stderr
