"""`epycctl status` for each state, built from real files: endpoint files planned by the real
planner, approvals made by the approval code, supervisor status files, stop markers, and
the fake systemctl's unit states."""

from __future__ import annotations

import json

import pytest

from epycd.status.stop import stop_marker_path
from tests.daemon.conftest import DaemonSandbox

pytestmark = pytest.mark.vllm
UNIT = "epyc-llm-chat.service"


def status_json(ws: DaemonSandbox, *args: str) -> dict[str, dict[str, object]]:
    done = ws.epycctl("status", "--json", *args)
    assert done.returncode == 0, done.stderr
    return {e["name"]: e for e in json.loads(done.stdout)["endpoints"]}


def test_pending_approval_shows_what_would_run(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    [chat] = status_json(ws).values()
    assert chat["state"] == "pending-approval"
    assert "epycctl approve chat" in str(chat["reason"])
    assert chat["model"] == str(ws.model)
    assert chat["socket"] == 0 and chat["cpus"] == "0-95" and chat["numa_nodes"] == [0]
    assert chat["url"] == f"http://127.0.0.1:{chat['port']}/v1"
    assert chat["unit"] == UNIT and chat["runtime"] == "host"
    assert isinstance(chat["kv_cache_gb"], int) and chat["kv_cache_gb"] > 0
    assert chat["handoff"] is None


def test_approved_installed_not_started(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    approval = ws.approve("chat")
    ws.set_unit(UNIT, "inactive")
    [chat] = status_json(ws).values()
    assert chat["state"] == "approved"
    assert chat["reason"] == "installed, not started"
    assert chat["port"] == approval.plan.decisions.port
    assert chat["approved_by"] == approval.approver.describe()
    assert any(
        call.startswith("show --property=") and UNIT in call for call in ws.systemctl_calls()
    )


def test_starting_takes_the_phase_from_the_supervisor(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "activating")
    ws.supervisor_says("chat", "starting", phase="health")
    [chat] = status_json(ws).values()
    assert (chat["state"], chat["phase"]) == ("starting", "health")
    assert chat["handoff"] is None


def test_ready_has_the_handoff(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    approval = ws.approve("chat")
    ws.set_unit(UNIT, "active")
    ws.supervisor_says("chat", "ready", phase="request")
    [chat] = status_json(ws).values()
    assert chat["state"] == "ready"
    handoff = chat["handoff"]
    assert isinstance(handoff, dict)
    port = approval.plan.decisions.port
    assert handoff["base_url"] == f"http://127.0.0.1:{port}/v1"
    assert handoff["served_model_name"] == approval.plan.decisions.served_model_name
    assert handoff["endpoint"] == "/v1/chat/completions"
    assert "chat template" in handoff["why"]
    assert (handoff["runtime"], handoff["port"]) == ("host", port)
    # 96 pinned cores, 2 of them left to the front end (docs/tuning.md rule 1)
    assert handoff["threads"] == 94 and handoff["cpus"] == "0-95"
    assert handoff["kv_cache_gb"] == approval.plan.decisions.kv_cache_gb
    assert handoff["max_model_len"] == approval.plan.decisions.max_model_len
    assert handoff["stop"] == "epycctl stop chat"
    assert "/v1/chat/completions" in handoff["curl"]
    assert 'api_key="EMPTY"' in handoff["python"]

    text = ws.epycctl("status", "chat")
    assert text.returncode == 0, text.stderr
    for needle in ("Base URL", "the trailing /v1", "epycctl stop chat", "curl -s", "OpenAI("):
        assert needle in text.stdout


def test_failed_carries_phase_reason_and_log_tail(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "failed", result="exit-code")
    ws.supervisor_says(
        "chat",
        "failed",
        phase="models",
        reason="/v1/models does not list chat",
        log_tail=["INFO loading", "ERROR served name mismatch"],
    )
    [chat] = status_json(ws).values()
    assert (chat["state"], chat["phase"]) == ("failed:models", "models")
    assert chat["reason"] == "/v1/models does not list chat"
    assert chat["log_tail"] == ["INFO loading", "ERROR served name mismatch"]


def test_failed_before_the_gate_says_so(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "failed", result="exit-code")
    [chat] = status_json(ws).values()
    assert (chat["state"], chat["phase"]) == ("failed:start", "start")
    assert "exit-code" in str(chat["reason"])


def test_stopped_by_the_admin(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "active")
    done = ws.epycctl("stop", "chat")
    assert done.returncode == 0, done.stderr
    assert stop_marker_path(ws.settings, "chat").exists()
    [chat] = status_json(ws).values()
    assert chat["state"] == "stopped"
    assert chat["stopped_by"] and "root" in str(chat["stopped_by"])
    assert chat["unit_state"] == "inactive"


def test_changed_needs_approval_has_the_diff_and_keeps_the_approved_columns(
    ws: DaemonSandbox,
) -> None:
    path = ws.endpoint("chat")
    approval = ws.approve("chat")
    ws.set_unit(UNIT, "active")
    path.write_text(path.read_text() + "max_model_len = 2048\n")
    [chat] = status_json(ws).values()
    assert chat["state"] == "changed-needs-approval"
    diff = str(chat["diff"])
    assert '+  "max_model_len": 2048' in diff and "--max-model-len 2048" in diff
    assert chat["max_model_len"] == approval.plan.decisions.max_model_len != 2048
    assert f"{UNIT} is running the approved units" in chat["reasons"]  # type: ignore[operator]
    assert chat["handoff"] is None


def test_orphaned_when_the_endpoint_file_is_gone(ws: DaemonSandbox) -> None:
    path = ws.endpoint("chat")
    ws.approve("chat")
    path.unlink()
    [chat] = status_json(ws).values()
    assert chat["state"] == "orphaned"
    assert "epycctl remove chat" in str(chat["reason"])


def test_unknown_name_is_bad_input(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    done = ws.epycctl("status", "nosuch", "--json")
    assert done.returncode == 2
    assert "no endpoint nosuch" in done.stderr and "Traceback" not in done.stderr
    bad = ws.epycctl("status", "../etc")
    assert bad.returncode == 2


def test_several_endpoints_and_no_systemd(ws: DaemonSandbox) -> None:
    """Two endpoints get disjoint sockets; with no systemctl answering, the supervisor's
    file still tells the state."""
    ws.endpoint("chat")
    ws.endpoint("base")
    ws.approve("chat")
    ws.supervisor_says("chat", "ready", phase="request")
    (ws.bin_dir / "systemctl").write_text(
        "#!/bin/sh\necho 'System has not been booted with systemd' >&2\nexit 1\n"
    )
    found = status_json(ws)
    assert found["chat"]["state"] == "ready" and found["chat"]["unit_state"] == "unknown"
    assert found["base"]["state"] == "pending-approval"
    assert {found["chat"]["socket"], found["base"]["socket"]} == {0, 1}
    assert found["chat"]["handoff"] is None  # several endpoints listed: name one for it
    one = status_json(ws, "chat")
    assert one["chat"]["handoff"] is not None
