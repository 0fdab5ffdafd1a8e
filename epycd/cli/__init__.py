"""`epycctl`, the admin's tool. Thin: every command parses, calls a stage, prints.

Subcommands live in their own modules and are imported only when run, so that
`epycctl detect` does not pay for httpx, huggingface_hub or the planner.

Errors are turned into messages here, once for every command: an `EpycError` (or an
`OSError` such as permission denied or a full disk) becomes one line on stderr and its exit
code, never a traceback; with --json also the command's one JSON object on stdout
(`epycd.cli.output.error_json`), as is a usage error (a bad or empty option value).
Before any command runs, epycd.conf and the EPYCD_* variables are validated, so a bad
settings file is reported the same way by every command.
An endpoint the planner could not plan for a reason no rule foresaw is that endpoint's one
error line; its traceback goes to the journal only (`epycd.errors.unexpected_error`).
"""

from __future__ import annotations

import copy
import errno
import functools
import importlib
import importlib.util
from typing import Any

import click

from epycd.cli.output import JSON_COMMAND, report_error, report_json_error
from epycd.errors import UNEXPECTED_LOG, EpycError, file_error
from epycd.events import EPYCCTL, journal_only
from epycd.paths import settings_given

COMMAND_ARGS = "epycctl.command_args"
"""ctx.meta key: the command line after `epycctl` (the command and its arguments)."""

COMMANDS: dict[str, tuple[str, str]] = {
    "detect": ("epycd.cli.detect", "detect"),
    "check-model": ("epycd.cli.model", "check_model"),
    "estimate": ("epycd.cli.model", "estimate"),
    "plan": ("epycd.cli.plan", "plan"),
    "approve": ("epycd.cli.approve", "approve"),
    "remove": ("epycd.cli.approve", "remove"),
    "status": ("epycd.cli.status", "status"),
    "stop": ("epycd.cli.status", "stop"),
    "start": ("epycd.cli.status", "start"),
    "logs": ("epycd.cli.status", "logs"),
    "quickstart": ("epycd.cli.quickstart", "quickstart"),
    "bench": ("epycd.cli.bench", "bench"),
    "instinct-recipes": ("epycd.cli.instinct", "instinct_recipes"),
    "metrics": ("epycd.cli.metrics", "metrics"),
    "export": ("epycd.cli.export", "export"),
    "gateway": ("epycd.cli.gateway", "gateway"),
}


def settings_checked(command: click.Command) -> click.Command:
    """`command` validating epycd.conf and the EPYCD_* variables before it runs (after its
    own options are parsed, so `--help` still works and `--json` reports the error). With
    neither there is nothing to validate, and pydantic is not loaded for it. A group's
    subcommands validate them, not the group, which runs before their options are parsed
    (`gateway keys --json` would report a bad settings file without its JSON object)."""
    if isinstance(command, click.Group):
        group = copy.copy(command)
        group.commands = {name: settings_checked(sub) for name, sub in command.commands.items()}
        return group
    callback = command.callback
    if callback is None:
        return command

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if settings_given():
            from epycd.settings import load_settings

            load_settings()
        return callback(*args, **kwargs)

    wrapped = copy.copy(command)
    wrapped.callback = checked
    return wrapped


def engine_commands() -> dict[str, tuple[str, str]]:
    """Each engine's own commands (`Engine.commands`): name -> (module, attribute). Read only
    to list the commands or run one that is not epycctl's own, so that epycctl's commands
    start without the engines' registry."""
    from epycd import engines

    return {
        name: (f"{engine.package}.commands", f"{name.replace('-', '_')}_command")
        for engine in engines.ENGINES
        for name in engine.commands
        if name not in COMMANDS
    }


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        every = COMMANDS | engine_commands()
        return sorted(name for name in every if self._importable(every[name][0]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = COMMANDS.get(cmd_name) or engine_commands().get(cmd_name)
        if found is None:
            return None
        module_name, attr = found
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        command: click.Command = getattr(module, attr)
        return settings_checked(command)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        ctx.meta[COMMAND_ARGS] = list(args)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EpycError as exc:
            report_error(ctx, exc)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise  # click's own handling: the reader went away
            report_error(ctx, file_error(exc))
        except click.ClickException as exc:
            _usage_error_as_json(ctx, exc)
            raise  # click prints the usage and the error on stderr, exit 2

    @staticmethod
    def _importable(module_name: str) -> bool:
        return importlib.util.find_spec(module_name) is not None


def _usage_error_as_json(ctx: click.Context, exc: click.ClickException) -> None:
    """A usage error (a bad or empty option value) of a command given --json: its JSON error
    object too, although --json itself may not have been parsed yet."""
    if JSON_COMMAND not in ctx.meta:
        command = exc.ctx if isinstance(exc, click.UsageError) else None
        if command is None or command is ctx or "--json" not in ctx.meta.get(COMMAND_ARGS, []):
            return
        if not any(param.name == "as_json" for param in command.command.params):
            return
        ctx.meta[JSON_COMMAND] = command
    report_json_error(ctx, exc.format_message(), exc.exit_code)


@click.group(
    name="epycctl", cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="epyc-llm")
def main() -> None:
    """Serve LLMs with vLLM on AMD EPYC CPUs: sized, pinned, approved, run by systemd."""
    journal_only(UNEXPECTED_LOG, EPYCCTL)
