"""`epycctl`, the admin's tool. Thin: every command parses, calls a stage, prints.

Subcommands live in their own modules and are imported only when run, so that
`epycctl detect` does not pay for httpx, huggingface_hub or the planner.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

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
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if self._importable(name))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr = COMMANDS[cmd_name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        command: click.Command = getattr(module, attr)
        return command

    @staticmethod
    def _importable(name: str) -> bool:
        return importlib.util.find_spec(COMMANDS[name][0]) is not None


@click.group(
    name="epycctl", cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="epyc-llm")
def main() -> None:
    """Serve LLMs with vLLM on AMD EPYC CPUs: sized, pinned, approved, run by systemd."""
