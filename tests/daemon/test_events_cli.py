"""`epycctl approve`, `stop`, `start` and `remove` send their journal events (epycd.events),
run in-process on the real planner and the fake systemctl: what reaches cysystemd's
`journal.send` is recorded (the one seam: this machine has no journald; tests/e2e reads the
real journal with `journalctl MESSAGE_ID=`)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from cysystemd import journal

from epycd.cli import main
from epycd.events import MESSAGE_IDS, Event
from tests.daemon.conftest import DaemonSandbox
from tests.machine import consent_on

pytestmark = pytest.mark.vllm
UNIT = "epyc-llm-chat.service"
EVENT_OF = {value: event for event, value in MESSAGE_IDS.items()}


def test_each_command_sends_its_event(ws: DaemonSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []

    def send(**fields: Any) -> int:
        sent.append(fields)
        return 0

    monkeypatch.setattr(journal, "send", send)
    runner = CliRunner()

    def epycctl(*args: str) -> list[dict[str, Any]]:
        sent.clear()
        result = runner.invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return list(sent)

    def events(fields: list[dict[str, Any]]) -> list[Event]:
        return [EVENT_OF[f["message_id"]] for f in fields]

    ws.endpoint("chat")
    approved = epycctl("approve", "chat", "--yes", *consent_on("Genoa"))
    assert events(approved) == [Event.APPROVE, Event.INSTALL, Event.START]
    assert all(
        f["endpoint"] == "chat" and f["syslog_identifier"] == "epycctl" and f["priority"] == "6"
        for f in approved
    ), approved
    assert approved[0]["message"].startswith("approved chat by root (uid 0) (")
    assert approved[0]["reason"].startswith("by root (uid 0) (")
    assert str(ws.settings.unit_dir / UNIT) in approved[1]["reason"]
    assert approved[2]["message"] == f"chat: starting {UNIT}, approved by root (uid 0)"

    ws.set_unit(UNIT, "active")
    stopped = epycctl("stop", "chat")
    assert events(stopped) == [Event.STOP]
    assert (stopped[0]["state"], stopped[0]["reason"]) == ("stopped", "by root (uid 0)")

    started = epycctl("start", "chat")
    assert events(started) == [Event.START]
    assert started[0]["message"] == f"chat: starting {UNIT}, by root (uid 0)"

    removed = epycctl("remove", "chat", "--yes")
    assert events(removed) == [Event.REMOVE]
    assert removed[0]["endpoint"] == "chat" and "state" not in removed[0]

    # --no-start installs without starting: approve and install only
    ws.endpoint("chat")
    assert events(epycctl("approve", "chat", "--yes", "--no-start", *consent_on("Genoa"))) == [
        Event.APPROVE,
        Event.INSTALL,
    ]
