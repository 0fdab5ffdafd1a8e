"""Option types: the text ones refuse an empty value (`TEXT`, `NonEmptyPath`); the numeric
ones refuse what click's ranges let through: `nan` and `inf` pass
a `FloatRange` with only a lower bound (every comparison with nan is false), and a range
without an upper bound takes absurd values (a load sample of a year, a context of 10^18
tokens). Each bound here says what is sane."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """A float in [min, max], never nan or inf."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


MAX_SAMPLE_SECONDS = 60.0
"""Sampling /proc/stat longer than a minute tells nothing a minute does not."""
MAX_SOCKET_GIB = 65536.0
"""64 TiB: ten times the most memory one EPYC socket takes."""
MAX_CONTEXT_TOKENS = 1 << 24
MAX_SEQUENCES = 1 << 16
MAX_LOG_LINES = 1_000_000

SAMPLE_SECONDS = FiniteFloatRange(min=0, max=MAX_SAMPLE_SECONDS)
SOCKET_GIB = FiniteFloatRange(min=0, min_open=True, max=MAX_SOCKET_GIB)
CONTEXT_TOKENS = click.IntRange(min=1, max=MAX_CONTEXT_TOKENS)
SEQUENCES = click.IntRange(min=1, max=MAX_SEQUENCES)
LOG_LINES = click.IntRange(min=0, max=MAX_LOG_LINES)


NUL_FIX = "a NUL character is not allowed: no name, id or path holds one"


def _refuse_nul(
    kind: click.ParamType[Any], value: Any, param: click.Parameter | None, ctx: click.Context | None
) -> None:
    """A NUL in a value (only a caller in-process can pass one: argv cannot hold it) would
    reach the OS as a path and fail there with a ValueError, not a message."""
    if isinstance(value, str) and "\0" in value:
        kind.fail(NUL_FIX, param, ctx)


class NonEmptyText(click.types.StringParamType):
    """A name, id or path given as text: never empty. An empty value would otherwise be read
    as "not given" (`--model ""` as the default model) or as the current folder."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(
                "an empty value is not allowed: give one, or leave the option out", param, ctx
            )
        _refuse_nul(self, value, param, ctx)
        return super().convert(value, param, ctx)


class NonEmptyPath(click.Path):
    """`click.Path` refusing an empty value, which it would read as the current folder."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(
                "an empty value is not allowed: give a path, or leave the option out", param, ctx
            )
        _refuse_nul(self, value, param, ctx)
        return super().convert(value, param, ctx)


TEXT = NonEmptyText()
"""The type of every text option (names, ids, versions, executables): see NonEmptyText."""
