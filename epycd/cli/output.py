"""How every command reports: JSON for scripts, tables for people, errors without tracebacks.

Exit codes (design.md): 0 success, 1 the answer is "no", 2 bad input.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar

import click

from epycd.errors import EpycError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_OK = 0
EXIT_NO = 1
EXIT_BAD_INPUT = 2


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn an `EpycError` into one line on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except EpycError as exc:
            click.echo(f"epycctl: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def table(rows: Iterable[Sequence[Any]], header: Sequence[str] | None = None) -> str:
    """A plain left-aligned text table; the first column is usually a label."""
    body = [[str(cell) for cell in row] for row in rows]
    if header:
        body.insert(0, [str(h) for h in header])
    if not body:
        return ""
    widths = [max(len(row[i]) for row in body if i < len(row)) for i in range(len(body[0]))]
    lines = []
    for index, row in enumerate(body):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if header and index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
