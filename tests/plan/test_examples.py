"""The example endpoint files under etc/ are valid endpoint files."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.spec import load_endpoint
from epycd.stack import shipped_stack

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "etc").glob("*.toml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    result = load_endpoint(path, precisions=shipped_stack().precisions)
    assert result.ok, [str(e) for e in result.errors]
