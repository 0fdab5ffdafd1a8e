"""Names from plans and command lines never escape their folders."""

from __future__ import annotations

import pytest

from epycd.approval.install import checked_unit_file
from epycd.errors import InputError
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
