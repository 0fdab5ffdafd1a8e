"""epycd/events.py: the MESSAGE_ID table (and docs/admin.md's, which must be the same), the
journal entry of an event, systemd's JOURNAL_STREAM check on real descriptors, and what
`emit` and `log_event` hand to cysystemd's `journal.send` (recorded: this machine has no
journald; tests/e2e reads the real one with `journalctl MESSAGE_ID=`)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cysystemd import journal

from epycd import events
from epycd.events import EPYCCTL, EPYCD, MESSAGE_IDS, Event, emit, journal_fields, log_event
from tests.sandbox import REPO

ROW = re.compile(r"^\| `([a-z]+)` \| `([0-9a-f]+)` \|", re.MULTILINE)


def readme_ids() -> dict[str, str]:
    text = (REPO / "docs" / "admin.md").read_text()
    section = text.split("## Journal events\n", 1)[1].split("\n## ", 1)[0]
    return dict(ROW.findall(section))


def test_every_event_has_its_own_128_bit_id() -> None:
    assert set(MESSAGE_IDS) == set(Event)
    ids = list(MESSAGE_IDS.values())
    assert len(set(ids)) == len(ids)
    for value in ids:
        assert re.fullmatch(r"[0-9a-f]{32}", value), value


def test_the_readme_lists_the_same_ids() -> None:
    assert readme_ids() == {str(event): value for event, value in MESSAGE_IDS.items()}


def test_the_ids_never_change() -> None:
    """An admin's saved `journalctl MESSAGE_ID=` query: the first and last, written down."""
    assert MESSAGE_IDS[Event.APPROVE] == "f85923999f9d486a97d89ee00599e855"
    assert MESSAGE_IDS[Event.REMOVE] == "eecf738f5fbc49ae90c84a5ad2ac4d08"


def test_journal_fields_without_the_optional_ones() -> None:
    assert journal_fields(Event.STOP, "chat", "chat stopped by root", identifier=EPYCCTL) == {
        "MESSAGE": "chat stopped by root",
        "MESSAGE_ID": MESSAGE_IDS[Event.STOP],
        "PRIORITY": "6",
        "SYSLOG_IDENTIFIER": "epycctl",
        "ENDPOINT": "chat",
    }


def test_journal_fields_with_instance_state_and_reason() -> None:
    fields = journal_fields(
        Event.RESTART,
        "pair",
        "pair instance 2: restarted",
        identifier=EPYCD,
        instance=2,
        state="starting",
        reason="signal KILL",
    )
    assert fields["SYSLOG_IDENTIFIER"] == "epycd" and fields["PRIORITY"] == "4"
    assert (fields["INSTANCE"], fields["STATE"], fields["REASON"]) == (
        "2",
        "starting",
        "signal KILL",
    )
    assert journal_fields(Event.READY, "p", "m", identifier=EPYCD, instance=0)["INSTANCE"] == "0"


@pytest.mark.parametrize(
    ("event", "priority"),
    [(Event.UNHEALTHY, "4"), (Event.RESTART, "4"), (Event.DRIFT, "5")]
    + [(e, "6") for e in Event if e not in {Event.UNHEALTHY, Event.RESTART, Event.DRIFT}],
)
def test_priorities(event: Event, priority: str) -> None:
    assert journal_fields(event, "a", "m", identifier=EPYCD)["PRIORITY"] == priority


def test_an_unknown_identifier_is_a_bug() -> None:
    with pytest.raises(ValueError, match="SYSLOG_IDENTIFIER"):
        journal_fields(Event.READY, "a", "m", identifier="vllm")


CHECK = "from epycd.events import journal_is_stderr; print(journal_is_stderr())"


def stderr_is_journal(stderr: Any, stream: str | None) -> bool:
    """`journal_is_stderr()` in a child whose fd 2 is `stderr`, with JOURNAL_STREAM=stream."""
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    if stream is not None:
        env["JOURNAL_STREAM"] = stream
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
        text=True,
        check=True,
        cwd=REPO,
    )
    answer = done.stdout.strip()
    assert answer in {"True", "False"}, answer
    return answer == "True"


def test_journal_stream_names_the_stderr_it_is(tmp_path: Path) -> None:
    """systemd's check on real descriptors: a file whose dev:ino is in JOURNAL_STREAM is the
    journal; a pipe, another file, no variable or a malformed one is not."""
    path, other = tmp_path / "stream", tmp_path / "other"
    path.touch()
    other.touch()
    here, there = os.stat(path), os.stat(other)
    same = f"{here.st_dev}:{here.st_ino}"
    with path.open("w") as stderr:
        assert stderr_is_journal(stderr, same)
        assert not stderr_is_journal(stderr, f"{there.st_dev}:{there.st_ino}")
        assert not stderr_is_journal(stderr, None)
        assert not stderr_is_journal(stderr, f"{here.st_dev}-{here.st_ino}")
        assert not stderr_is_journal(stderr, f"x:{here.st_ino}")
    assert not stderr_is_journal(subprocess.PIPE, same)
    read, write = os.pipe()
    try:
        pipe = os.fstat(write)
        assert not stderr_is_journal(write, same)
        assert pipe.st_ino != here.st_ino
        # the pipe itself named: it is what fd 2 is, so it counts (systemd's own rule)
        assert stderr_is_journal(write, f"{pipe.st_dev}:{pipe.st_ino}")
    finally:
        os.close(read)
        os.close(write)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What reaches cysystemd's `journal.send` (its keyword arguments)."""
    calls: list[dict[str, Any]] = []

    def record(**fields: Any) -> int:
        calls.append(fields)
        return 0

    monkeypatch.setattr(journal, "send", record)
    return calls


def test_emit_hands_cysystemd_lower_case_keys(sent: list[dict[str, Any]]) -> None:
    assert emit(Event.DRIFT, "chat", "chat: changed", identifier=EPYCD, state="x", reason="r")
    assert sent == [
        {
            "message": "chat: changed",
            "message_id": MESSAGE_IDS[Event.DRIFT],
            "priority": "5",
            "syslog_identifier": "epycd",
            "endpoint": "chat",
            "state": "x",
            "reason": "r",
        }
    ]


@pytest.mark.parametrize("error", [OSError(9, "bad fd"), ValueError("bad field")])
def test_emit_never_fails_its_caller(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def broken(**_fields: Any) -> int:
        raise error

    monkeypatch.setattr(journal, "send", broken)
    assert emit(Event.STOP, "chat", "m", identifier=EPYCCTL) is False


def test_a_refused_send_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "send", lambda **_fields: -13)
    assert emit(Event.STOP, "chat", "m", identifier=EPYCCTL) is False


def test_emit_without_journald_does_nothing_and_says_sent() -> None:
    """The real cysystemd here, where no journald socket exists: sd_journal_sendv returns 0."""
    if Path("/run/systemd/journal/socket").exists():
        pytest.skip("a real journald listens here: this would write to it")
    assert emit(Event.STOP, "chat", "m", identifier=EPYCCTL, instance=1) is True


def test_log_event_logs_the_line_when_stderr_is_not_the_journal(
    sent: list[dict[str, Any]], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logger = logging.getLogger("epycd-test")
    with caplog.at_level(logging.INFO, logger="epycd-test"):
        log_event(logger, logging.WARNING, Event.UNHEALTHY, "chat", "chat: ready -> starting")
    assert sent == []
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "chat: ready -> starting")
    ]


def test_log_event_sends_natively_when_stderr_is_the_journal(
    sent: list[dict[str, Any]], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "journal_is_stderr", lambda: True)
    logger = logging.getLogger("epycd-test")
    with caplog.at_level(logging.INFO, logger="epycd-test"):
        log_event(
            logger, logging.INFO, Event.READY, "pair", "pair instance 1: starting -> ready",
            instance=1, state="ready",
        )  # fmt: skip
    assert caplog.records == []
    assert sent == [
        {
            "message": "pair instance 1: starting -> ready",
            "message_id": MESSAGE_IDS[Event.READY],
            "priority": "6",
            "syslog_identifier": "epycd",
            "endpoint": "pair",
            "instance": "1",
            "state": "ready",
        }
    ]


def test_log_event_falls_back_to_the_line_when_the_journal_refuses(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "journal_is_stderr", lambda: True)
    monkeypatch.setattr(journal, "send", lambda **_fields: -111)
    logger = logging.getLogger("epycd-test")
    with caplog.at_level(logging.INFO, logger="epycd-test"):
        log_event(logger, logging.INFO, Event.START, "chat", "chat: starting it")
    assert [r.getMessage() for r in caplog.records] == ["chat: starting it"]


FORGED = "\nepycd: chat: ready -> crash-loop"
"""A model file's text (config.json's `architectures`, a GGUF file's general.name) with a
newline that would forge a daemon line if it passed raw."""


def test_journal_fields_escape_a_model_files_text() -> None:
    """MESSAGE, STATE and REASON carry what the daemon read (a model's architecture in a
    refusal): each is one line, the newline written as `\\n`; the ids stay as they are."""
    fields = journal_fields(
        Event.UNHEALTHY,
        "chat",
        "chat: ready -> failed: Qwen3ForCausalLM" + FORGED,
        identifier=EPYCD,
        state="failed",
        reason="Qwen3ForCausalLM" + FORGED + "\x1b[2J\u202e",
    )
    assert all("\n" not in value and "\x1b" not in value for value in fields.values())
    assert fields["MESSAGE"] == (
        "chat: ready -> failed: Qwen3ForCausalLM\\nepycd: chat: ready -> crash-loop"
    )
    assert fields["REASON"].endswith("\\nepycd: chat: ready -> crash-loop\\x1b[2J\\u202e")
    assert fields["MESSAGE_ID"] == MESSAGE_IDS[Event.UNHEALTHY]


def test_log_event_sends_model_text_escaped_to_the_journal(
    sent: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "journal_is_stderr", lambda: True)
    log_event(
        logging.getLogger("epycd-test"), logging.WARNING, Event.DRIFT, "chat",
        "chat: changed" + FORGED, state="changed-needs-approval", reason="arch" + FORGED,
    )  # fmt: skip
    [entry] = sent
    assert "\n" not in entry["message"] + entry["reason"]
    assert entry["message"] == "chat: changed\\nepycd: chat: ready -> crash-loop"


def one_line_log(logger: logging.Logger, write: Any) -> None:
    handler = logging.StreamHandler(write)
    handler.setFormatter(events.OneLineFormatter())
    logger.addHandler(handler)
    logger.propagate = False


def test_a_daemon_line_of_model_text_stays_one_line(tmp_path: Path) -> None:
    """The daemon's stderr (the journal under systemd, one entry per line): a message, its
    arguments and an exception's own text are escaped; a traceback keeps its line breaks."""
    path = tmp_path / "stderr"
    logger = logging.getLogger("epycd-test-one-line")
    with path.open("w") as stream:
        one_line_log(logger, stream)
        logger.warning("%s: %s", "hf", "not servable: Qwen3ForCausalLM" + FORGED)
        try:
            raise ValueError("no architecture Qwen3ForCausalLM" + FORGED)
        except ValueError:
            logger.exception("planning failed" + FORGED)
    lines = path.read_text().splitlines()
    assert not [line for line in lines if line.startswith("epycd: chat")], lines
    assert lines[0] == "hf: not servable: Qwen3ForCausalLM\\nepycd: chat: ready -> crash-loop"
    assert lines[1] == "planning failed\\nepycd: chat: ready -> crash-loop"
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == (
        "ValueError: no architecture Qwen3ForCausalLM\\nepycd: chat: ready -> crash-loop"
    )
