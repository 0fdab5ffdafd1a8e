"""What the boot gates a unit runs before its service (`epycd.approval.check`,
`epycd.approval.ready`) share at their edge: the settings are read, the gate answers one line,
and the process exits with the gate's code. An error the gate did not turn into its own line
(settings, an unreadable file) is still one line naming the unit, never a traceback: the
journal shows only what the gate printed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

import click

from epycd.errors import EpycError, file_error
from epycd.settings import Settings, load_settings
from epycd.text import escaped

Gate = Callable[[Settings, str], tuple[int, str]]
"""(settings, endpoint name) -> (exit code, the one line to print)."""


def gate_command(command: str, gate: Gate, failed: Callable[[str], str], doc: str) -> click.Command:
    """The click command `python -m MODULE NAME` runs: `gate` for endpoint NAME, through
    `run_gate`; `failed(NAME)` starts the line of an error outside its answer."""

    @click.command(name=command, help=doc)
    @click.argument("name")
    def main(name: str) -> None:
        run_gate(gate, name, failed(name))

    return main


def run_gate(gate: Gate, name: str, failed: str) -> NoReturn:
    """Run `gate` for endpoint `name` and exit with its code, its line on stdout when 0, else
    on stderr; an error before or outside its answer is `FAILED: why`."""
    try:
        code, line = gate(load_settings(), name)
    except EpycError as exc:
        code, line = exc.exit_code, f"{failed}: {exc}"
    except OSError as exc:
        error = file_error(exc)
        code, line = error.exit_code, f"{failed}: {error}"
    click.echo(escaped(line), err=code != 0)
    sys.exit(code)
