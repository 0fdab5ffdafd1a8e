"""`epycctl status` run by a user who is not root (uid 65534 through setpriv): it works,
and a root-only token file it cannot read is not a change of the approved endpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonSandbox
from tests.secrets import root_folder, write_secret

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root"),
]
NOBODY = 65534
UNIT = "epyc-llm-chat.service"


def test_a_root_only_token_file_is_not_a_change_for_a_user(ws: DaemonSandbox) -> None:
    with root_folder() as secrets:
        token_file_is_not_a_change(ws, write_secret(secrets / "hf-token", "hf_not_a_real_token\n"))


def token_file_is_not_a_change(ws: DaemonSandbox, token: Path) -> None:
    ws.endpoint("chat", f'hf_token_file = "{token}"\n')
    approval = ws.approve("chat")
    ws.set_unit(UNIT, "inactive")

    as_root = ws.epycctl("status", "--json")
    assert as_root.returncode == 0, as_root.stderr
    as_user = ws.epycctl("status", "--json", user=NOBODY)
    assert as_user.returncode == 0, as_user.stderr
    assert "Traceback" not in as_user.stderr
    [root_row] = json.loads(as_root.stdout)["endpoints"]
    [user_row] = json.loads(as_user.stdout)["endpoints"]
    assert root_row["state"] == user_row["state"] == "approved"
    assert user_row["port"] == approval.plan.decisions.port
    assert user_row["diff"] is None
    assert any(str(token) in reason and "root-only" in reason for reason in user_row["reasons"])
    assert "hf_not_a_real_token" not in as_user.stdout + as_user.stderr


def test_a_root_only_endpoint_file_is_not_a_change_for_a_user(ws: DaemonSandbox) -> None:
    path = ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "inactive")
    path.chmod(0o600)
    done = ws.epycctl("status", "--json", user=NOBODY)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["endpoints"]
    assert row["state"] == "approved", row["reasons"]
    assert any(str(path) in reason and "root-only" in reason for reason in row["reasons"])
