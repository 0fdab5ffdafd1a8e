"""Where tests keep key and token files. The product accepts an api_key_file or hf_token_file
only when root alone controls it and every folder up its path (ssh's rule, a sticky /tmp
included), so a test's secrets cannot live under pytest's tmp_path in /tmp: `root_folder` makes
a fresh folder in a root-owned system folder (/srv first), removed afterwards. Root only: a
secret owned by anyone else is refused anyway."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BASES = ("/srv", "/opt", "/mnt")


def root_controlled_chain(folder: Path) -> bool:
    for part in (folder, *folder.parents):
        info = part.stat()
        if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


@contextmanager
def root_folder() -> Iterator[Path]:
    """A new folder, mode 0755, whose path only root controls; skips the test as non-root."""
    if os.geteuid() != 0:
        pytest.skip("a secret the product accepts is owned by root: run the tests as root")
    base = next((Path(b) for b in BASES if Path(b).is_dir() and root_controlled_chain(Path(b))),
                None)  # fmt: skip
    if base is None:
        pytest.skip(f"none of {BASES} is a folder only root controls")
    folder = Path(tempfile.mkdtemp(prefix="epyc-llm-test-", dir=base))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_secret(path: Path, text: str, mode: int = 0o600) -> Path:
    """A key or token file as an admin makes it: root's, `mode`, its folders made 0755."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def secrets_dir() -> Iterator[Path]:
    with root_folder() as folder:
        yield folder
