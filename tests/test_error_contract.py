"""The one error contract (docs/architecture.md, "Command contract"): every `--json` command
prints one JSON object on stdout, error or not, with the stderr line unchanged; bad input is
exit 2 and names the endpoint file and its key; an empty option value is refused, never read as
a default or as the current folder."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from epycd.cli import COMMANDS, main
from epycd.cli.options import NonEmptyPath, NonEmptyText
from epycd.host.facts import HostVllmFacts, RuntimeFacts
from tests.plan.conftest import PlanWorkspace, fake_host, write_model
from tests.sandbox import CliSandbox

JSON_COMMANDS: dict[str, list[str]] = {
    "status": ["status", "nope", "--json"],
    "plan": ["plan", "nope", "--json"],
    "detect": ["detect", "--json"],
    "check-model": ["check-model", "/nonexistent/model", "--json"],
    "estimate": ["estimate", "/nonexistent/model", "--json", "--socket-gb", "64"],
    "bench": ["bench", "nope", "--json"],
}
"""The six commands that printed nothing on stdout on an error, each with arguments."""
REQUEST = {
    "status": {"endpoint": "nope"},
    "plan": {"endpoint": "nope"},
    "detect": {},
    "check-model": {"model": "/nonexistent/model"},
    "estimate": {"model": "/nonexistent/model"},
    "bench": {"endpoint": "nope"},
}


def one_error_object(stdout: str, stderr: str, exit_code: int) -> dict[str, object]:
    """The JSON object on stdout: the stderr line's error and the exit code."""
    data = json.loads(stdout)
    assert isinstance(data, dict)
    assert data["result"] == "error" and data["exit_code"] == exit_code
    assert stderr.splitlines()[-1] == f"epycctl: {data['error']}"
    return data


@pytest.mark.parametrize("command", sorted(JSON_COMMANDS))
def test_a_bad_settings_file_is_one_json_object(command: str, tmp_path: Path) -> None:
    (tmp_path / "epycd.conf").write_text("admin_grop = 'wheel'\n")
    result = CliRunner().invoke(
        main, JSON_COMMANDS[command], env={"EPYCD_CONFIG_DIR": str(tmp_path)}
    )
    assert result.exit_code == 2, result.output
    data = one_error_object(result.stdout, result.stderr, 2)
    assert "admin_grop" in str(data["error"]) and data["command"] == command
    assert {k: data[k] for k in REQUEST[command]} == REQUEST[command]


@pytest.fixture
def ws(tmp_path: Path) -> PlanWorkspace:
    return PlanWorkspace(tmp_path)


@pytest.fixture
def sandbox(tmp_path: Path) -> CliSandbox:
    box = CliSandbox.create(tmp_path)
    box.use_fake_host()
    return box


@pytest.mark.parametrize("command", sorted(JSON_COMMANDS))
def test_the_commands_own_error_is_one_json_object(command: str, sandbox: CliSandbox) -> None:
    """Unknown endpoint, missing model folder, a host root without /proc: the error line on
    stderr as before, and the same error as the one JSON object on stdout."""
    argv = JSON_COMMANDS[command]
    if command == "detect":
        argv = [*argv, "--root", str(sandbox.tmp / "no-such-root")]
    done = sandbox.epycctl(*argv, HF_HUB_OFFLINE="1")
    assert done.returncode == 2, done.stderr
    data = one_error_object(done.stdout, done.stderr, 2)
    assert {k: data[k] for k in REQUEST[command]} == REQUEST[command]
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("command", ["plan", "detect"])
def test_a_usage_error_with_json_is_one_json_object_too(command: str) -> None:
    argv = [command, *(["x"] if command == "plan" else []), "--json", "--root", ""]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["exit_code"] == 2 and "'--root'" in data["error"] and "empty" in data["error"]
    assert "Usage:" in result.stderr


# Bad input is exit 2, naming the endpoint file and the key.


def test_a_missing_host_vllm_is_bad_input_naming_the_file_and_key(ws: PlanWorkspace) -> None:
    host = fake_host(ws.tmp, "this-machine-genoa-vm", RuntimeFacts())
    file = ws.endpoint("host", 'runtime = "host"\nvllm = "/nonexistent/bin/vllm"\n')
    missing = HostVllmFacts(path="/nonexistent/bin/vllm", present=False, error="not found")
    result = ws.plan(host, probe=lambda _path: missing)["host"]
    assert result.exit_code == 2
    [problem] = result.errors
    assert (problem.file, problem.key) == (str(file), "vllm")
    assert problem.text.startswith(f"{file}: vllm: the host vLLM /nonexistent/bin/vllm")


def test_a_host_without_a_usable_vllm_of_its_own_stays_a_no(ws: PlanWorkspace) -> None:
    """No `vllm` key: the vLLM on PATH is the host's, not the file's: refused, exit 1."""
    broken = HostVllmFacts(path="/usr/bin/vllm", present=False, error="cannot import vllm")
    host = fake_host(ws.tmp, "this-machine-genoa-vm", RuntimeFacts(vllm=broken))
    ws.endpoint("host", 'runtime = "host"\n')
    assert ws.plan(host)["host"].exit_code == 1


@pytest.mark.parametrize(
    ("case", "exit_code"),
    [("missing folder", 2), ("config.json not JSON", 2), ("unsupported architecture", 1)],
)
def test_a_model_error_names_the_endpoint_file_and_key_model(
    ws: PlanWorkspace, case: str, exit_code: int
) -> None:
    folder = ws.tmp / "models" / "other"
    if case == "config.json not JSON":
        write_model(folder)
        (folder / "config.json").write_text("{not json")
    elif case == "unsupported architecture":
        write_model(folder, {"architectures": ["NoSuchForCausalLM"], "model_type": "nosuch"})
    file = ws.endpoint("m", f'model = "{folder}"\n')
    result = ws.plan(fake_host(ws.tmp, "this-machine-genoa-vm"))["m"]
    assert result.exit_code == exit_code, result.errors
    problem = result.errors[0]
    assert (problem.file, problem.key) == (str(file), "model"), problem
    assert problem.text.startswith(f"{file}: model: ")
    if case != "unsupported architecture":
        assert str(folder) in problem.text


# Empty option values.


def every_text_param() -> Iterator[tuple[str, click.Parameter]]:
    """Every option of every command that takes a name, id, version or path as text."""
    for name, (module, attr) in sorted(COMMANDS.items()):
        command: click.Command = getattr(importlib.import_module(module), attr)
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag:
                continue
            if isinstance(param.type, (click.types.StringParamType, click.Path)):
                yield name, param


TEXT_OPTIONS = [pytest.param(n, p, id=f"{n} {p.opts[-1]}") for n, p in every_text_param()]


def test_the_walk_finds_the_options_of_the_issue() -> None:
    found = {(name, param.opts[-1]) for name, param in every_text_param()}
    assert {("quickstart", "--model"), ("quickstart", "--vllm"), ("plan", "--root")} <= found


@pytest.mark.parametrize(("command", "param"), TEXT_OPTIONS)
def test_every_text_option_refuses_an_empty_value(command: str, param: click.Option) -> None:
    assert isinstance(param.type, (NonEmptyText, NonEmptyPath)), (
        f"{command} {param.opts[-1]}: use epycd.cli.options.TEXT or NonEmptyPath"
    )
    flag = param.opts[-1]
    result = CliRunner().invoke(main, [command, flag, "", "x"])
    assert result.exit_code == 2, result.output
    assert f"'{flag}'" in result.stderr or f"'{param.opts[0]} / {flag}'" in result.stderr
    assert "empty value is not allowed" in result.stderr


@pytest.mark.parametrize("option", ["--model", "--vllm"])
def test_quickstart_refuses_an_empty_model_or_vllm(option: str, sandbox: CliSandbox) -> None:
    done = sandbox.epycctl("quickstart", option, "", "--yes")
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for '{option}': an empty value is not allowed" in done.stderr
    assert sandbox.written() == []
