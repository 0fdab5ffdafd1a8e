"""The real tools the render tests trust: systemd-analyze verify and Quadlet 5.4's generator."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

VERIFY = ["systemd-analyze", "verify", "--man=no", "--generators=no", "--recursive-errors=no"]
GENERATED = re.compile(
    r"^---(?P<name>[^\n]+?)---\n(?P<text>.*?)(?=^---[^\n]+---\n|\Z)", re.S | re.M
)
QUADLET_LOG = re.compile(r"^quadlet-generator\[\d+\]: Loading source unit file \S+$")


def test_cache() -> Path:
    return Path(os.environ.get("EPYC_TEST_CACHE", "/var/cache/epyc-llm-test"))


def quadlet_binary() -> Path:
    binary = test_cache() / "quadlet" / "root" / "usr" / "libexec" / "podman" / "quadlet"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"the Quadlet generator is missing ({binary}): run tests/bootstrap.sh")
    return binary


def verify(units: list[Path]) -> None:
    """systemd-analyze verify on all units at once: exit 0 and not one line on stderr."""
    if not units:
        return
    result = subprocess.run(
        [*VERIFY, *map(str, units)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stderr == "", (
        f"systemd-analyze verify exit {result.returncode}:\n{result.stderr}"
    )


def quadlet_dryrun(folder: Path) -> dict[str, str]:
    """Generated service name -> text for every `.container` in the folder."""
    result = subprocess.run(
        [str(quadlet_binary()), "-dryrun"],
        env={**os.environ, "QUADLET_UNIT_DIRS": str(folder)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = [line for line in result.stderr.splitlines() if not QUADLET_LOG.match(line)]
    assert result.returncode == 0 and not problems, (
        f"quadlet -dryrun exit {result.returncode}:\n{result.stderr}"
    )
    return {m["name"]: m["text"] for m in GENERATED.finditer(result.stdout)}


def write_units(folder: Path, units: dict[str, str]) -> list[Path]:
    """The folder afterwards holds exactly these units."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    paths = []
    for name, text in units.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
