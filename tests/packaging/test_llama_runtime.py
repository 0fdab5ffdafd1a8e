"""packaging/llama-runtime.sh, the llama.cpp runtime's recipe, run for real where it decides
without building: a finished runtime is left alone, a host without a compiler or an index is
told the fix and nothing is changed. The build itself runs in the bootstrap
(tests/tools/llama_server.sh), and tests/llama/ serves with what it built."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from epycd.engines.llama_cpp.model import format as llama_tables
from tests.packaging.shellcheck import shellcheck
from tests.sandbox import REPO

RECIPE = REPO / "packaging" / "llama-runtime.sh"
UNREACHABLE = {"PIP_INDEX_URL": "file:///nonexistent/simple", "PIP_NO_INDEX": ""}


def recipe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RECIPE), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def finished(dest: Path, stamp: str) -> Path:
    """A runtime as the recipe leaves it: both binaries and the stamp; the server returned."""
    (dest / "bin").mkdir(parents=True)
    for name in ("llama", "llama-server"):
        binary = dest / "bin" / name
        binary.write_text("#!/bin/sh\necho built before\n")
        binary.chmod(0o755)
    (dest / ".epyc-stamp").write_text(stamp + "\n")
    return dest / "bin" / "llama-server"


def test_the_recipe_passes_shellcheck() -> None:
    done = shellcheck(RECIPE, REPO / "tests" / "tools" / "llama_server.sh")
    assert done.returncode == 0, done.stdout


def test_it_builds_the_source_the_architecture_table_was_read_from() -> None:
    pinned = re.search(r"^LLAMA_CPP_PYTHON=(\S+)$", RECIPE.read_text(), re.MULTILINE)
    assert pinned is not None
    assert pinned[1] == llama_tables.pinned_version()
    stamp = recipe("--stamp").stdout
    assert stamp.startswith(f"llama-cpp-python=={pinned[1]} bin=llama-server,llama native=")


def test_a_finished_runtime_is_left_as_it_is(tmp_path: Path) -> None:
    stamp = recipe("--stamp").stdout.strip()
    server = finished(tmp_path / "llama", stamp)
    done = recipe(str(tmp_path / "llama"), env=UNREACHABLE)
    assert done.returncode == 0, done.stderr
    assert "is provisioned" in done.stdout
    assert server.read_text().endswith("echo built before\n")
    # no kept source and no index: the converter is skipped, said, and nothing fails
    assert "converter: not installed" in done.stdout, done.stdout
    assert not (tmp_path / "llama" / "converter").exists()


def test_a_runtime_missing_a_binary_is_not_finished(tmp_path: Path) -> None:
    finished(tmp_path / "llama", recipe("--stamp").stdout.strip())
    (tmp_path / "llama" / "bin" / "llama").unlink()
    done = recipe(str(tmp_path / "llama"), env=UNREACHABLE)
    assert done.returncode == 1
    assert "cannot reach the package index" in done.stderr


def test_a_runtime_built_on_another_cpu_is_kept_when_no_index_is_reachable(
    tmp_path: Path,
) -> None:
    pinned = recipe("--stamp").stdout.split()[0]
    server = finished(tmp_path / "llama", f"{pinned} native=000000000000")
    done = recipe(str(tmp_path / "llama"), env=UNREACHABLE)
    assert done.returncode == 1
    assert "cannot reach the package index" in done.stderr
    assert "nothing was changed" in done.stderr
    assert "llama-runtime.sh --download DIR" in done.stderr
    assert (tmp_path / "llama" / ".epyc-stamp").read_text().endswith("native=000000000000\n")
    assert server.is_file() and not (tmp_path / "llama" / ".build").exists()


def test_without_a_compiler_it_names_the_package_and_changes_nothing(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("bash", "python3", "grep", "tr", "sort", "sed", "sha256sum", "cut", "cat",
                 "nproc", "mkdir", "rm", "dirname"):  # fmt: skip
        found = shutil.which(name)
        assert found is not None
        (tools / name).symlink_to(found)
    done = recipe(str(tmp_path / "llama"), env={"PATH": str(tools)})
    assert done.returncode == 2
    assert "apt-get install g++" in done.stderr
    assert not (tmp_path / "llama").exists()


@pytest.mark.parametrize("jobs", ["0", "x", "-1"])
def test_jobs_must_be_a_positive_number(tmp_path: Path, jobs: str) -> None:
    done = recipe(str(tmp_path / "llama"), "--jobs", jobs)
    assert done.returncode == 2
    assert not (tmp_path / "llama").exists()
