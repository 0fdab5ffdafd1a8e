"""Journal events: what happened to an endpoint, with a stable `MESSAGE_ID` an admin can
search for (`journalctl MESSAGE_ID=...`) and structured fields (ENDPOINT, INSTANCE, STATE,
REASON). The README's "Journal events" table lists the ids; they never change.

`journal_fields` builds an entry (pure); `emit` sends it to journald natively (with the
`cysystemd` package), and never fails its caller: without a journald socket it does
nothing. `epycctl` prints what it prints and emits as well. The daemon's stderr already goes
to the journal under systemd, so `log_event` sends an event natively when stderr is the
journal (`journal_is_stderr`, systemd's `JOURNAL_STREAM` check) and logs the same line to
stderr otherwise: each event is in the journal once.

What leaves for the journal quotes what the daemon read (a model's architecture, an endpoint
file's value), so it is `escaped` where it leaves, once per edge: `journal_fields` for an
event's fields, `OneLineFormatter` for a logged line (the daemon's stderr, `JournalLog`).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Iterator, Mapping
from enum import StrEnum
from types import TracebackType

from epycd.text import escaped, is_digits


class Event(StrEnum):
    APPROVE = "approve"
    INSTALL = "install"
    START = "start"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    RESTART = "restart"
    DRIFT = "drift"
    STOP = "stop"
    REMOVE = "remove"


MESSAGE_IDS: dict[Event, str] = {
    Event.APPROVE: "f85923999f9d486a97d89ee00599e855",
    Event.INSTALL: "1175226463dd42fe921cdf42122e82bf",
    Event.START: "3a6c47dc67004e79b62d4efb0bad3fe0",
    Event.READY: "cc2d0e9a26fe4dc5b6283a6d18abda1b",
    Event.UNHEALTHY: "37739e4066f24c5584d66d991f40fd7f",
    Event.RESTART: "074e6b34bab949dea98a2436dc69ea01",
    Event.DRIFT: "05d6eb635a864bd9b4348322600ac566",
    Event.STOP: "da76d893c1e647f1bdae86c5100153b5",
    Event.REMOVE: "eecf738f5fbc49ae90c84a5ad2ac4d08",
}
"""An admin contract: written once, never changed (README, "Journal events")."""

WARNING, NOTICE, INFO = 4, 5, 6
"""syslog priorities (journald's PRIORITY=)."""
PRIORITIES: dict[Event, int] = {
    Event.UNHEALTHY: WARNING,
    Event.RESTART: WARNING,
    Event.DRIFT: NOTICE,
}
"""The others are INFO."""

EPYCD = "epycd"
EPYCCTL = "epycctl"
IDENTIFIERS = frozenset({EPYCD, EPYCCTL})
"""SYSLOG_IDENTIFIER: the daemon or the admin's CLI."""


def priority(event: Event) -> int:
    return PRIORITIES.get(event, INFO)


def journal_fields(
    event: Event,
    endpoint: str,
    message: str,
    *,
    identifier: str,
    instance: int | None = None,
    state: str | None = None,
    reason: str | None = None,
) -> dict[str, str]:
    """The journal entry of one event (field name -> value); INSTANCE, STATE and REASON
    only when given. Every value is `escaped`: MESSAGE and REASON carry what the daemon read
    (a model's architecture in a refusal, an endpoint file's value), which must read as the
    one line it is in `journalctl`, whoever sends the entry. Pure."""
    if identifier not in IDENTIFIERS:
        raise ValueError(f"unknown SYSLOG_IDENTIFIER {identifier!r}")
    fields = {
        "MESSAGE": message,
        "MESSAGE_ID": MESSAGE_IDS[event],
        "PRIORITY": str(priority(event)),
        "SYSLOG_IDENTIFIER": identifier,
        "ENDPOINT": endpoint,
    }
    optional = {"INSTANCE": instance, "STATE": state, "REASON": reason}
    fields.update({key: str(value) for key, value in optional.items() if value is not None})
    return {key: escaped(value) for key, value in fields.items()}


def send(fields: Mapping[str, str]) -> bool:
    """One entry to journald; False when it was not sent (no `cysystemd`, or journald
    refused it). No journald socket at all is not an error to `sd_journal_sendv`: True."""
    try:
        from cysystemd import journal
    except ImportError:
        return False
    try:
        result = journal.send(**{key.lower(): value for key, value in fields.items()})
    except (OSError, ValueError):
        return False
    return not (isinstance(result, int) and result < 0)


def emit(
    event: Event,
    endpoint: str,
    message: str,
    *,
    identifier: str,
    instance: int | None = None,
    state: str | None = None,
    reason: str | None = None,
) -> bool:
    """Send the event to the journal; never raises. True when it was sent."""
    fields = journal_fields(
        event,
        endpoint,
        message,
        identifier=identifier,
        instance=instance,
        state=state,
        reason=reason,
    )
    return send(fields)


SYSLOG_PRIORITIES: dict[int, int] = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: WARNING,
    logging.INFO: INFO,
    logging.DEBUG: 7,
}
"""A logging level as journald's PRIORITY= (syslog's crit, err, warning, info, debug)."""


def _raised(error: BaseException | None) -> Iterator[BaseException]:
    """The exception and those it was raised from or during, as a traceback shows them."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


class OneLineFormatter(logging.Formatter):
    """A log record as text whose message is one line (`escaped`): what it quotes from a
    model file or an endpoint file (an architecture, a name) cannot start a line of its own
    in the journal, where each line of the daemon's stderr is an entry. A traceback keeps
    its line breaks (Python's own), with each exception's text escaped, since that is where
    a quoted value would be in it. Nothing is cached on the record, so another handler's
    formatting does not change this one's."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        text = escaped(self.formatMessage(record))
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text

    def formatException(
        self,
        ei: tuple[type[BaseException], BaseException, TracebackType | None]
        | tuple[None, None, None],
    ) -> str:
        text = super().formatException(ei)
        for error in _raised(ei[1]):
            said = "".join(traceback.format_exception_only(type(error), error)).rstrip("\n")
            text = text.replace(said, escaped(said))
        return text


class JournalLog(logging.Handler):
    """Log records (a traceback included) to the journal only, under `identifier`: what a
    person at a terminal must not be shown raw still reaches the journal. Without journald
    the record is dropped, never printed: `send` never raises."""

    def __init__(self, identifier: str) -> None:
        super().__init__(logging.WARNING)
        self.identifier = identifier
        self.setFormatter(OneLineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        level = max((lv for lv in SYSLOG_PRIORITIES if lv <= record.levelno), default=0)
        send(
            {
                "MESSAGE": self.format(record),
                "PRIORITY": str(SYSLOG_PRIORITIES.get(level, WARNING)),
                "SYSLOG_IDENTIFIER": self.identifier,
            }
        )


def journal_only(logger_name: str, identifier: str) -> None:
    """Send `logger_name`'s records to the journal (`JournalLog`) and so away from Python's
    last-resort handler, which prints to stderr when no handler is set; once per process."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(handler, JournalLog) for handler in logger.handlers):
        logger.addHandler(JournalLog(identifier))


def journal_is_stderr() -> bool:
    """systemd's documented check (systemd.exec(5), `$JOURNAL_STREAM`): stderr is connected
    to the journal when JOURNAL_STREAM="DEV:INODE" names the descriptor behind fd 2."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not is_digits(dev) or not is_digits(ino):
        return False
    try:
        stat = os.fstat(2)
    except OSError:
        return False
    return (stat.st_dev, stat.st_ino) == (int(dev), int(ino))


def log_event(
    logger: logging.Logger,
    level: int,
    event: Event,
    endpoint: str,
    message: str,
    *,
    instance: int | None = None,
    state: str | None = None,
    reason: str | None = None,
) -> None:
    """The daemon's event: natively to the journal when stderr is the journal (MESSAGE is
    the line it would log), else (or when that fails) the line to `logger` as before."""
    if journal_is_stderr() and emit(
        event,
        endpoint,
        message,
        identifier=EPYCD,
        instance=instance,
        state=state,
        reason=reason,
    ):
        return
    logger.log(level, "%s", message)
