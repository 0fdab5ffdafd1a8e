"""A real HF hub cache (HF_HOME/hub) holding the fixture models, used offline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.model.hf_cache import add_to_cache
from tests.model.models import model_files


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf_home")
    scratch = tmp_path_factory.mktemp("scratch")
    for repo_id, files in model_files(scratch).items():
        add_to_cache(home / "hub", repo_id, files)
    return home


@pytest.fixture
def offline_hub(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HF_HOME at the fixture cache, HF_HUB_OFFLINE=1, no token, no other cache override."""
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HF_ENDPOINT", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield hf_home
