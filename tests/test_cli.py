"""`epycctl` itself: every command it names, its own and each engine's (`Engine.commands`),
has its own help, reachable even when the settings file is broken (help reads no settings),
and an unknown command is bad input."""

from __future__ import annotations

import importlib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from epycd.cli import COMMANDS, engine_commands, main

EVERY_COMMAND = COMMANDS | engine_commands()


def command_of(name: str) -> click.Command:
    module, attr = EVERY_COMMAND[name]
    command: click.Command = getattr(importlib.import_module(module), attr)
    return command


def test_top_level_help_lists_every_command_with_its_summary() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: epycctl [OPTIONS] COMMAND [ARGS]...\n")
    listed = result.output.split("Commands:\n", 1)[1]
    rows = {line.split()[0]: line for line in listed.splitlines() if line.strip()}
    assert sorted(rows) == sorted(EVERY_COMMAND)
    for name, row in rows.items():
        summary = command_of(name).get_short_help_str(limit=45)
        assert summary and summary.rstrip(".")[:30] in row, (name, row)


@pytest.mark.parametrize("name", sorted(EVERY_COMMAND))
def test_each_command_has_its_own_help_even_with_a_broken_settings_file(
    name: str, tmp_path: Path
) -> None:
    (tmp_path / "epycd.conf").write_text("admin_grop = 'wheel'\n")
    command = command_of(name)
    result = CliRunner().invoke(
        main, [name, "--help"], env={"EPYCD_CONFIG_DIR": str(tmp_path)}, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    usage = " ".join(command.collect_usage_pieces(click.Context(command)))
    assert result.output.startswith(f"Usage: epycctl {name} {usage}\n"), result.output
    assert command.help, f"{name} has no docstring"
    assert command.help.split("\n")[0].strip() in " ".join(result.output.split())
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert any(flag in result.output for flag in param.opts), (name, param.opts)
    assert "admin_grop" not in result.output


def test_unknown_command_is_bad_input() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command 'no-such-command'" in result.output


def test_an_engines_own_command_is_found_in_its_package() -> None:
    """llama.cpp's `convert`, in its package's commands module, not epycctl's table."""
    assert "convert" not in COMMANDS
    assert engine_commands()["convert"] == ("epycd.engines.llama_cpp.commands", "convert_command")
    assert command_of("convert").name == "convert"
