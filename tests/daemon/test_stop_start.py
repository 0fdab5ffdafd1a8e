"""`epycctl stop/start/logs`: admin only, the stop marker, what reaches systemctl, and the
boot-time approval check refusing a stopped endpoint (a Quadlet unit cannot be disabled)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from epycd.status.stop import stop_marker_path
from tests.daemon.conftest import DaemonSandbox

pytestmark = pytest.mark.vllm
UNIT = "epyc-llm-chat.service"
NOBODY = 65534


def state_of(ws: DaemonSandbox) -> str:
    done = ws.epycctl("status", "chat", "--json")
    assert done.returncode == 0, done.stderr
    state: str = json.loads(done.stdout)["endpoints"][0]["state"]
    return state


def boot_check(ws: DaemonSandbox) -> subprocess.CompletedProcess[str]:
    return ws.epycctl("chat", module="epycd.approval.check")


def test_stop_then_start(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "active")
    assert boot_check(ws).returncode == 0

    stopped = ws.epycctl("stop", "chat")
    assert stopped.returncode == 0, stopped.stderr
    assert "until `epycctl start chat`" in stopped.stdout
    calls = ws.systemctl_calls()
    assert f"stop {UNIT}" in calls and f"disable {UNIT}" in calls
    assert ws.units()[UNIT]["UnitFileState"] == "disabled"
    marker = json.loads(stop_marker_path(ws.settings, "chat").read_text())
    assert marker["endpoint"] == "chat" and marker["by"].startswith("root")
    assert state_of(ws) == "stopped"

    refused = boot_check(ws)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "epyc-llm-chat: stopped by the admin; `epycctl start chat` starts it again"
    )

    started = ws.epycctl("start", "chat")
    assert started.returncode == 0, started.stderr
    assert not stop_marker_path(ws.settings, "chat").exists()
    calls = ws.systemctl_calls()
    assert calls.index(f"enable {UNIT}") < calls.index(f"start {UNIT}")
    assert ws.units()[UNIT]["ActiveState"] == "active"
    assert boot_check(ws).returncode == 0
    assert state_of(ws) == "ready"


def test_start_refuses_a_changed_or_unapproved_endpoint(ws: DaemonSandbox) -> None:
    path = ws.endpoint("chat")
    pending = ws.epycctl("start", "chat")
    assert pending.returncode == 1
    assert "pending-approval" in pending.stderr and "Traceback" not in pending.stderr

    ws.approve("chat")
    assert ws.epycctl("stop", "chat").returncode == 0
    path.write_text(path.read_text() + "max_model_len = 2048\n")
    before = ws.systemctl_calls()
    changed = ws.epycctl("start", "chat")
    assert changed.returncode == 1
    assert "changed-needs-approval" in changed.stderr
    assert '+  "max_model_len": 2048' in changed.stderr
    assert [c for c in ws.systemctl_calls() if not c.startswith("show ")] == [
        c for c in before if not c.startswith("show ")
    ]
    assert stop_marker_path(ws.settings, "chat").exists()


def test_unknown_names_are_bad_input(ws: DaemonSandbox) -> None:
    for verb in ("stop", "start", "logs"):
        done = ws.epycctl(verb, "nosuch")
        assert done.returncode == 2, (verb, done.stderr)
        assert "no endpoint nosuch" in done.stderr
    assert ws.epycctl("stop", "../x").returncode == 2
    assert ws.systemctl_calls() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_only_admins_stop_and_start(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "active")
    for verb in ("stop", "start"):
        done = ws.epycctl(verb, "chat", user=NOBODY)
        assert done.returncode == 1, done.stderr
        assert f"{verb} needs root" in done.stderr and "Traceback" not in done.stderr
    assert not stop_marker_path(ws.settings, "chat").exists()
    assert not any(c.startswith(("stop", "start", "disable")) for c in ws.systemctl_calls())


def test_logs_execs_journalctl_for_the_unit(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    journalctl = ws.bin_dir / "journalctl"
    journalctl.write_text('#!/bin/sh\necho "journalctl $*"\n')
    journalctl.chmod(0o755)
    done = ws.epycctl("logs", "chat", "-n", "7", "-f")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"journalctl --unit {UNIT} --lines 7 --follow"


def test_stop_and_start_answer_in_json(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "active")
    stopped = ws.epycctl("stop", "chat", "--json")
    assert stopped.returncode == 0, stopped.stderr
    answer = json.loads(stopped.stdout)
    assert (answer["endpoint"], answer["action"], answer["result"]) == ("chat", "stop", "stopped")
    assert f"systemctl stop {UNIT}" in answer["steps"]

    started = ws.epycctl("start", "chat", "--json")
    assert started.returncode == 0, started.stderr
    answer = json.loads(started.stdout)
    assert (answer["endpoint"], answer["action"], answer["result"]) == ("chat", "start", "started")
    assert f"systemctl start {UNIT} (waits for the health gate)" in answer["steps"]

    refused = ws.epycctl("start", "nosuch", "--json")
    assert refused.returncode == 2
    answer = json.loads(refused.stdout)
    assert answer["result"] == "error" and "no endpoint nosuch" in answer["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_start_with_a_read_only_state_folder_names_the_marker(ws: DaemonSandbox) -> None:
    from tests.approval.test_resources import read_only

    ws.endpoint("chat")
    ws.approve("chat")
    assert ws.epycctl("stop", "chat").returncode == 0
    marker = stop_marker_path(ws.settings, "chat")
    before = ws.systemctl_calls()
    with read_only(marker.parent):
        done = ws.epycctl("start", "chat")
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(marker) in line and "remount it read-write" in line
    assert marker.exists()
    assert [c for c in ws.systemctl_calls() if not c.startswith("show ")] == [
        c for c in before if not c.startswith("show ")
    ]
