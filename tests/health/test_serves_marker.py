"""A test that starts a real `vllm serve` must be marked `serves`, or it would run beside the
heavy group's machines and servers (tests/conftest.py) and starve with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.realvllm import ServingTest, serve_argv, vllm_env


def test_an_unmarked_test_cannot_make_a_serving_environment(tmp_path: Path) -> None:
    assert not ServingTest.marked
    with pytest.raises(pytest.fail.Exception, match="not marked `serves`"):
        vllm_env(tmp_path)


def test_an_unmarked_test_cannot_make_a_serve_command(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"add pytest\.mark\.serves"):
        serve_argv(tmp_path / "model", 8000, "tiny")
