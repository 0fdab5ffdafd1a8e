"""Names from plans and command lines never escape their folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epycd.approval.install import checked_unit_file
from epycd.approval.record import checked_name
from epycd.approval.state import endpoint_states
from epycd.errors import InputError
from epycd.spec import parse_endpoint
from epycd.stack import shipped_stack
from tests.approval.conftest import ApprovalSandbox


@pytest.mark.parametrize(
    "name", ["../x.service", "/etc/passwd", "a.d/b/c.conf", "x.service/y.conf", ".hidden", ""]
)
def test_unsafe_unit_file_names_are_refused(name: str) -> None:
    with pytest.raises(InputError, match="unsafe unit file name"):
        checked_unit_file(name)


@pytest.mark.parametrize(
    "name", ["epyc-llm-chat.service", "epyc-llm-chat.container.d/10-pull.conf"]
)
def test_unit_file_names(name: str) -> None:
    assert str(checked_unit_file(name)) == name


@pytest.mark.parametrize("command", ["approve", "remove"])
def test_endpoint_name_cannot_be_a_path(env: ApprovalSandbox, command: str) -> None:
    done = env.epycctl(command, "../../etc/x", "--yes")
    assert done.returncode == 2
    assert "'../../etc/x' is not an endpoint name" in done.stderr


NOT_ENDPOINT_NAMES = ["Chat", "a.b", "a_b", "a@b", "a" * 64]


@pytest.mark.parametrize("name", NOT_ENDPOINT_NAMES)
def test_a_name_no_endpoint_file_can_have_is_refused_by_the_commands_too(
    env: ApprovalSandbox, name: str
) -> None:
    spec = parse_endpoint(
        env.settings.config_dir / f"{name}.toml",
        b'model = "Qwen/Qwen3-0.6B"\n',
        precisions=shipped_stack().precisions,
    )
    assert not spec.ok and "is not a valid endpoint name" in spec.errors[0].message
    env.set_plans()
    for command in ("approve", "remove"):
        done = env.epycctl(command, name, "--yes")
        assert done.returncode == 2, done.stderr
        assert f"{name!r} is not an endpoint name" in done.stderr


@given(st.text(alphabet="aZ09-_.@ ", min_size=1, max_size=66))
def test_the_endpoint_file_and_the_approval_layer_accept_the_same_names(name: str) -> None:
    spec = parse_endpoint(
        Path(f"/nonexistent/{name}.toml"), b"", precisions=shipped_stack().precisions
    )
    named_ok = not any(e.key == "file name" for e in spec.errors)
    try:
        checked_name(name)
    except InputError:
        assert not named_ok
    else:
        assert named_ok


def test_unit_files_no_endpoint_could_own_are_not_orphans(env: ApprovalSandbox) -> None:
    unit_dir = env.settings.unit_dir
    for stem in ("epyc-llm-chat", "epyc-llm-Chat", "epyc-llm-a_b"):
        (unit_dir / f"{stem}.service").write_text("[Service]\nExecStart=/bin/true\n")
    states = endpoint_states(env.settings, {})
    assert [(s.endpoint, s.state) for s in states] == [("chat", "orphaned")]
