"""epycd.service caps its memory (MemoryHigh= below MemoryMax=, both above what epycd and the
vLLM probe it runs hold), so a runaway in the daemon can never take the host; the unit, as
both packages install it, passes `systemd-analyze verify`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.render.realtools import VERIFY
from tests.sandbox import REPO

UNIT = REPO / "units" / "epycd.service"
SIZES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
NEEDED = 512 << 20
"""epycd (about 60 MB) with the host vLLM probe importing vLLM and torch (about 340 MiB)."""


def limit(key: str) -> int:
    [value] = re.findall(rf"^{key}=(\d+)([KMG])$", UNIT.read_text(), re.M)
    return int(value[0]) * SIZES[value[1]]


def test_the_daemon_has_a_memory_ceiling_above_what_it_needs() -> None:
    assert NEEDED <= limit("MemoryHigh") < limit("MemoryMax") <= 2 << 30


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """As installed (ExecStart= at an executable that exists here)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: run tests/bootstrap.sh (apt-get install systemd)")
    unit = tmp_path / "epycd.service"
    unit.write_text(UNIT.read_text().replace("/opt/epyc-llm/bin/epycd", "/bin/true"))
    done = subprocess.run(
        [*VERIFY, str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
