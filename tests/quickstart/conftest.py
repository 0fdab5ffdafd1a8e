from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.realvllm import vllm_executable
from tests.sandbox import SYSTEM_BIN, CliSandbox


@pytest.fixture
def sandbox(tmp_path: Path) -> CliSandbox:
    """The real `epycctl` on this machine's host (or `use_fake_host`), with a PATH of our
    choosing: first `bin_dir`, then the system's folders (not the caller's PATH)."""
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    sandbox = CliSandbox.create(tmp_path, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    sandbox.search_path = SYSTEM_BIN
    return sandbox


def real_vllm() -> Path:
    return vllm_executable()
