"""How every command reports: JSON for scripts, tables for people, errors without tracebacks.

Exit codes (docs/architecture.md, "Command contract"): 0 success, 1 the answer is "no", 2 bad input.
With `--json` every command prints exactly one JSON object on stdout, its answer or its error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, ParamSpec, TypeVar

import click

from epycd.errors import EpycError
from epycd.text import escaped, escaped_lines

P = ParamSpec("P")
R = TypeVar("R")

EXIT_OK = 0
EXIT_NO = 1
EXIT_BAD_INPUT = 2

JSON_COMMAND = "epycctl.json_command"
"""ctx.meta key: the context of a command run with --json."""
JSON_ACTION = "epycctl.json_action"
"""ctx.meta key: the --json command changes something (approve, remove, stop, start)."""
JSON_PRINTED = "epycctl.json_printed"
"""ctx.meta key: the command's one JSON object is out."""
ACTION_REPORT = "epycctl.action_report"


def error_json(command: click.Context, error: str, exit_code: int) -> dict[str, Any]:
    """The one JSON object a `--json` command prints on an error: what the request was
    about (`endpoint` for a NAME, `model` for a MODEL), `result: error`, the `error` line as
    stderr has it and the `exit_code`. A command that changes something also names its
    `action` (and the `steps` it took), as its success object does."""
    params = command.params
    about: dict[str, Any] = {"endpoint": params["name"]} if "name" in params else {}
    about |= {"model": params["model"]} if "model" in params else {}
    if command.meta.get(JSON_ACTION):
        report: ActionReport | None = command.meta.get(ACTION_REPORT)
        return (
            {"endpoint": params.get("name"), "action": command.info_name}
            | {"result": "error", "error": error, "exit_code": exit_code}
            | ({"steps": report.steps} if report else {})
        )
    return {"command": command.info_name, **about, "result": "error", "error": error,
            "exit_code": exit_code}  # fmt: skip


def report_json_error(ctx: click.Context, error: str, exit_code: int) -> None:
    """With `--json`, the error as the command's one JSON object on stdout (unless the
    command already printed its object)."""
    command: click.Context | None = ctx.meta.get(JSON_COMMAND)
    if command is not None and not ctx.meta.get(JSON_PRINTED):
        print_json(error_json(command, error, exit_code))


def report_error(ctx: click.Context, exc: EpycError) -> NoReturn:
    """One line on stderr (control characters escaped) and the error's exit code; with
    `--json`, also the error as the command's JSON object on stdout (`error_json`)."""
    report_json_error(ctx, str(exc), exc.exit_code)
    click.echo(f"epycctl: {escaped(str(exc))}", err=True)
    ctx.exit(exc.exit_code)


def _errors_as_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[JSON_COMMAND] = ctx
    return value


def _action_errors_as_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[JSON_ACTION] = True
    return _errors_as_json(ctx, param, value)


def json_option(
    help_text: str, *, errors_too: bool = False
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`--json`: the command's answer as one JSON object on stdout, and its error as one
    too (`error_json`); `errors_too` marks the commands that change something, whose error
    object has their `action` and `steps`."""
    callback = _action_errors_as_json if errors_too else _errors_as_json
    return click.option("--json", "as_json", is_flag=True, callback=callback, help=help_text)


class ActionReport:
    """What `approve`, `stop`, `start` or `remove` did: lines for a person, or, with
    `--json`, one object with stable keys (`endpoint`, `action`, `result`, `steps`, and
    `error` when it failed) for a script."""

    def __init__(self, endpoint: str, action: str, *, as_json: bool) -> None:
        self.endpoint = endpoint
        self.action = action
        self.as_json = as_json
        self.steps: list[str] = []
        click.get_current_context().meta[ACTION_REPORT] = self

    def say(self, line: str = "", *, err: bool = False) -> None:
        """A step: printed for a person (on stderr with `err`), listed under `steps` in the
        JSON."""
        if self.as_json:
            if line:
                self.steps.append(line)
        else:
            click.echo(escaped_lines(line), err=err)

    def show(self, text: str) -> None:
        """Text only a person reads (a plan, a list of files); not part of the JSON."""
        if not self.as_json:
            click.echo(escaped_lines(text))

    def done(self, result: str, line: str, **fields: Any) -> None:
        """The last word: `line` for a person, or the JSON object with `result` and
        `fields`."""
        if self.as_json:
            print_json(
                {"endpoint": self.endpoint, "action": self.action, "result": result}
                | fields
                | {"steps": self.steps}
            )
        else:
            self.say(line)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[JSON_PRINTED] = True


def table(rows: Iterable[Sequence[Any]], header: Sequence[str] | None = None) -> str:
    """A plain left-aligned text table; the first column is usually a label."""
    body = [[escaped(str(cell)) for cell in row] for row in rows]
    if header:
        body.insert(0, [escaped(str(h)) for h in header])
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
