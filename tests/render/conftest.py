from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plan.conftest import host_of, ws  # noqa: F401 (the fake-host planner's fixtures)
from tests.render.manager import UserManager


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real executable file standing in for a host vLLM's `vllm` (never run by verify)."""
    path = tmp_path_factory.mktemp("vllm-env") / "vllm"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def product_python() -> str:
    return sys.executable


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserManager]:
    user_manager = UserManager(tmp_path_factory.mktemp("user-manager"))
    user_manager.start()
    try:
        yield user_manager
    finally:
        user_manager.stop()
