"""Errors the commands turn into messages and exit codes (docs/architecture.md, "Command contract").

An error names what was wrong (the file and the key where there is one) and how to fix it;
the CLI prints it without a traceback.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is not imported by the light commands that import this
    from pydantic import ValidationError

UNEXPECTED_LOG = "epycd.unexpected"
"""The logger of `unexpected_error`'s tracebacks: the daemon's stderr (the journal), and
only the journal for `epycctl` (`epycd.events.journal_only`), never the admin's terminal."""


class EpycError(Exception):
    """Base of every error the product reports to a person."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: Path | str | None = None,
        key: str | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.key = key
        self.fix = fix

    def __str__(self) -> str:
        where = ""
        if self.file and self.key:
            where = f"{self.file}: {self.key}: "
        elif self.file:
            where = f"{self.file}: "
        elif self.key:
            where = f"{self.key}: "
        text = f"{where}{self.message}"
        if self.fix:
            text += f" ({self.fix})"
        return text


class InputError(EpycError):
    """Bad input: a missing or malformed file, an unknown key, a wrong value. Exit 2."""

    exit_code = 2


class Refusal(EpycError):
    """The answer is "no": does not fit, not supported, blocked. Exit 1."""

    exit_code = 1


FILE_ERROR_FIXES: dict[int, str] = {
    errno.EACCES: "run it as root, or give this user access to the file and its folder",
    errno.EPERM: "run it as root, or give this user access to the file and its folder",
    errno.EROFS: "the file system is mounted read-only: remount it read-write",
    errno.ENOSPC: "the file system is full: free space on it, then run the command again",
    errno.EDQUOT: "the disk quota is used up: free space or raise the quota, then run it again",
}


def file_error(exc: OSError, doing: str = "") -> Refusal:
    """An `OSError` (permission denied, disk full, read-only) as a refusal naming the file and
    the fix: exit 1, since the input was right but the machine would not let it happen."""
    said = exc.strerror or str(exc)
    return Refusal(
        f"{doing}: {said}" if doing else said,
        file=exc.filename,
        fix=FILE_ERROR_FIXES.get(exc.errno or 0, "check the file and its folder"),
    )


def unexpected_error(exc: Exception, *, file: Path | str, doing: str) -> Refusal:
    """An exception no rule of ours raised, met while `doing` one endpoint file's work: the
    traceback to the journal (`UNEXPECTED_LOG`), one line for the admin naming the file and
    where the rest is. A refusal (exit 1): the file may be right, this endpoint cannot be
    planned, and the caller leaves it out so that every other endpoint is planned as if it
    were absent. Only the exception's type is shown: its text may quote a file's content."""
    logging.getLogger(UNEXPECTED_LOG).error("%s: %s failed unexpectedly", file, doing, exc_info=exc)
    return Refusal(
        f"{doing} failed unexpectedly ({type(exc).__name__}); this endpoint is left out and the "
        "others are planned without it",
        file=file,
        fix="the traceback is in the journal (journalctl -t epycctl; epycd's: journalctl -u "
        "epycd): report it with the endpoint file",
    )


def validation_error(exc: ValidationError, *, file: Path | str, fix: str) -> InputError:
    """A shipped or written JSON file that its pydantic model refused: its first error,
    naming the file and the key (the error's location, dotted)."""
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    return InputError(first["msg"], file=file, key=key, fix=fix)
