"""systemd's and Quadlet's quoting rules: every value that reaches a unit file goes through here.

systemd (systemd.syntax(7), systemd.service(5) "Command lines", systemd.exec(5)):
- `%` starts a specifier in nearly every setting: a literal `%` is `%%`. Command lines expand
  specifiers after unquoting, so `%` must be doubled even inside quotes.
- Command lines substitute `$VAR` / `${VAR}` at exec time: a literal `$` is `$$`.
  `Environment=` does not substitute variables, so there `$` stays as it is.
- Command lines and `Environment=` are split at whitespace, unquoted and C-unescaped: a word
  with whitespace, quotes or backslashes goes in double quotes with `\\` and `\"` escaped.
- A lone unquoted `;` separates two commands on one command line.
- A line ending in `\\` continues on the next line; control characters are refused outright,
  so no value can end a line and start a directive.

Quadlet (podman-systemd.unit(5), podman 5.4): `Exec=`, `PodmanArgs=` and `Environment=` are
split and unescaped with systemd's rules, then re-quoted into the generated `ExecStart=`, but
`$` and `%` pass through untouched (so they are escaped as on a command line, environment
values included, since they become `--env K=V` words), a `;` word comes out bare (a command
separator), and an empty word ends the list (everything after it is lost). Raw keys
(`Volume=`, `HealthCmd=`, `Image=`) are not unquoted at all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from epycd.errors import InputError
from epycd.text import first_unsafe

SAFE_FIX = "use printable characters only: no newlines, tabs or other control characters"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NEEDS_QUOTES = frozenset(" \t\"'\\;")


def check_printable(value: str, what: str) -> str:
    """The value itself, when no character in it could end a line or break the file."""
    bad = first_unsafe(value)
    if bad is not None:
        index, char = bad
        raise InputError(
            f"{what} contains the control character U+{ord(char):04X} at position {index}: "
            f"{value!r}",
            key=what,
            fix=SAFE_FIX,
        )
    return value


def escape_specifiers(value: str) -> str:
    return value.replace("%", "%%")


def escape_variables(value: str) -> str:
    return value.replace("$", "$$")


def quote_word(value: str) -> str:
    """One word for a line systemd unquotes and C-unescapes; `%`/`$` are not touched here.
    Any Unicode whitespace is quoted too: Quadlet trims it (U+00A0, U+2003...) from the end
    of a line, where systemd would have kept it."""
    if value and not any(char in _NEEDS_QUOTES or char.isspace() for char in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def plain_value(value: str, what: str) -> str:
    """A setting that expands specifiers but is not unquoted (Description=, comments)."""
    check_printable(value, what)
    if value != value.strip() or value.endswith("\\"):
        raise InputError(
            f"{what} cannot begin or end with whitespace or end with a backslash: {value!r}",
            key=what,
            fix="remove the leading/trailing whitespace or backslash",
        )
    return escape_specifiers(value)


def exec_argument(value: str, what: str) -> str:
    """One argument of a command line (ExecStart= and friends, Quadlet's Exec=/PodmanArgs=)."""
    check_printable(value, what)
    return quote_word(escape_variables(escape_specifiers(value)))


def executable(path: str, what: str) -> str:
    """The first word of a command line: an absolute path systemd can run as given."""
    check_printable(path, what)
    if not path.startswith("/") or path.endswith("/"):
        raise InputError(
            f"{what} must be an absolute path to a file: {path!r}",
            key=what,
            fix="give the full path, e.g. /usr/bin/python3",
        )
    bad = sorted({char for char in path if char in "\"'\\$"})
    if bad:
        raise InputError(
            f"{what} cannot contain {' '.join(bad)} (systemd cannot run such a path): {path!r}",
            key=what,
            fix="install it under a path without quotes, backslashes or $",
        )
    return quote_word(escape_specifiers(path))


def command_line(argv: Sequence[str], what: str, *, prefix: str = "") -> str:
    """A whole command line: `prefix` is systemd's `-`/`+`/`!` executable prefix."""
    if not argv:
        raise InputError(f"{what} is an empty command", key=what)
    words = [prefix + executable(argv[0], f"{what}[0]")]
    words += [exec_argument(arg, f"{what}[{index}]") for index, arg in enumerate(argv[1:], 1)]
    return " ".join(words)


def env_name(name: str, what: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise InputError(
            f"{what}: {name!r} is not a valid environment variable name",
            key=what,
            fix="use ASCII letters, digits and _ (not starting with a digit)",
        )
    return name


def env_assignment(name: str, value: str, what: str) -> str:
    """One assignment for a unit's `Environment=`: quoted as a whole, `$` left alone."""
    env_name(name, what)
    check_printable(value, what)
    return quote_word(f"{name}={escape_specifiers(value)}")


def quadlet_argument(value: str, what: str) -> str:
    """One word of Quadlet's `Exec=`/`PodmanArgs=`: what Quadlet re-quotes must stay one word."""
    if value == "":
        raise InputError(
            f"{what} is an empty argument; Quadlet drops it and every argument after it",
            key=what,
            fix="remove the empty argument",
        )
    if value == ";":
        raise InputError(
            f"{what} is a lone ';', which Quadlet writes unquoted into ExecStart= where systemd "
            "reads it as a second command",
            key=what,
            fix="remove the ';' argument",
        )
    return exec_argument(value, what)


def quadlet_env_assignment(name: str, value: str, what: str) -> str:
    """One assignment for Quadlet's `Environment=`: it becomes `--env K=V` on a command line."""
    env_name(name, what)
    return exec_argument(f"{name}={value}", what)


def quadlet_raw(value: str, what: str) -> str:
    """A Quadlet key Quadlet copies into one ExecStart word without unquoting it."""
    check_printable(value, what)
    if value != value.strip() or not value:
        raise InputError(
            f"{what} cannot be empty or begin or end with whitespace: {value!r}",
            key=what,
            fix="remove the surrounding whitespace",
        )
    return escape_variables(escape_specifiers(value))
