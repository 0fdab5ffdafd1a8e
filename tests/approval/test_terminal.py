"""The yes/no question on a real terminal (a pseudo-terminal): only "y" approves."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from epycd.approval.record import load_approval
from tests.approval.conftest import ApprovalSandbox
from tests.approval.planned_epycctl import MODULE as PLANNED_EPYCCTL
from tests.approval.plans import make_plan
from tests.sandbox import REPO


def answer_on_a_terminal(env: ApprovalSandbox, answer: str, *args: str) -> tuple[int, str]:
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", PLANNED_EPYCCTL, *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env.environ(),
        cwd=REPO,
        close_fds=True,
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while b"[y/N]" not in seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"no question asked: {seen.decode(errors='replace')}")
        seen += os.read(leader, 65536)
    os.write(leader, answer.encode() + b"\n")
    code = proc.wait(timeout=60)
    try:
        while chunk := os.read(leader, 65536):
            seen += chunk
    except OSError:
        pass
    os.close(leader)
    return code, seen.decode(errors="replace")


@pytest.mark.parametrize(("answer", "approved"), [("y", True), ("n", False), ("", False)])
def test_terminal_question(env: ApprovalSandbox, answer: str, approved: bool) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    code, output = answer_on_a_terminal(env, answer, "approve", "chat", "--no-start")
    assert "Approve chat and install these units? [y/N]" in output
    assert code == (0 if approved else 1), output
    assert (load_approval(env.settings, "chat") is not None) == approved
    if not approved:
        assert "not approved: nothing changed" in output
