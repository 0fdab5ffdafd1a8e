"""systemd's quoting rules as the renderer applies them (the real tools check them too)."""

from __future__ import annotations

import pytest

from epycd.errors import InputError
from epycd.render.syntax import (
    command_line,
    env_assignment,
    exec_argument,
    executable,
    plain_value,
    quadlet_argument,
    quadlet_env_assignment,
    quadlet_raw,
)


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain", "plain"),
        ("a b", '"a b"'),
        ("", '""'),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ("${X}", "$${X}"),
        ('say "hi"', '"say \\"hi\\""'),
        ("it's", '"it\'s"'),
        ("back\\slash", '"back\\\\slash"'),
        (";", '";"'),
        ("é✓ 日本", '"é✓ 日本"'),
    ],
)
def test_exec_argument(value: str, quoted: str) -> None:
    assert exec_argument(value, "arg") == quoted


@pytest.mark.parametrize(
    "bad", ["a\nb", "a\rb", "tab\there", "nul\x00", "del\x7f", "c1\x85", "ls\u2028"]
)
def test_control_characters_are_refused_with_the_value_named(bad: str) -> None:
    for render in (exec_argument, plain_value, quadlet_argument, quadlet_raw):
        with pytest.raises(InputError) as caught:
            render(bad, "vllm_args[2]")
        assert caught.value.key == "vllm_args[2]"
        assert repr(bad) in caught.value.message
    with pytest.raises(InputError):
        env_assignment("X", bad, "env.X")


def test_environment_quotes_the_whole_assignment_and_keeps_dollar() -> None:
    assert env_assignment("A", "1", "env.A") == "A=1"
    assert env_assignment("A", "x y $Z 5%", "env.A") == '"A=x y $Z 5%%"'
    assert env_assignment("A", 'q"\\', "env.A") == '"A=q\\"\\\\"'


def test_quadlet_environment_escapes_dollar_because_it_becomes_a_command_word() -> None:
    assert quadlet_env_assignment("A", "x $Z 5%", "env.A") == '"A=x $$Z 5%%"'


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "", "É"])
def test_bad_variable_names(name: str) -> None:
    with pytest.raises(InputError, match="not a valid environment variable name"):
        env_assignment(name, "v", f"env.{name}")


@pytest.mark.parametrize("value", ["", ";"])
def test_quadlet_refuses_words_it_would_mangle(value: str) -> None:
    with pytest.raises(InputError) as caught:
        quadlet_argument(value, "vllm_args[3]")
    assert caught.value.key == "vllm_args[3]"


@pytest.mark.parametrize("path", ["python", "bin/python", "/x/", "/a'b", '/a"b', "/a\\b", "/a$b"])
def test_executable_must_be_a_plain_absolute_path(path: str) -> None:
    with pytest.raises(InputError):
        executable(path, "product_python")


def test_command_line_with_prefix_and_specifiers() -> None:
    line = command_line(["/opt/my env/bin/python", "-c", "print('100%')"], "cmd", prefix="-")
    assert line == '-"/opt/my env/bin/python" -c "print(\'100%%\')"'


@pytest.mark.parametrize("value", [" lead", "trail ", "ends\\"])
def test_plain_values_cannot_end_a_line_early_or_continue_it(value: str) -> None:
    with pytest.raises(InputError):
        plain_value(value, "model")
