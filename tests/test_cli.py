from click.testing import CliRunner

from epycd.cli import COMMANDS, main


def test_help_lists_only_built_commands() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "Usage: epycctl" in result.output


def test_unknown_command_is_bad_input() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "no-such-command" not in COMMANDS
