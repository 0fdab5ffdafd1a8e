"""The proof that a new engine needs no edit in epycd: the test-only toy engine
(tests/engines/toy), installed as any engine from a distribution of its own would be (its
`epycd.engines` entry point, tests/engines/plugins), passes the engine-wide conformance suite
(test_conformance.py, and the sets' reservations of tests/plan/test_set_reservations.py
against the built-in engines) in a process of its own: planned on every fake host, its units
through the real systemd-analyze, a bad socket refused alone, what it holds reserved,
approved through the real `epycctl` and a change seen as drift, status's columns, epycd's plan
series, and its export refused with its reason. Without that folder on the path, epycd
knows no toy engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from epycd.engines import ENGINES

REPO = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).parent / "plugins"


def test_epycd_knows_no_toy_engine_without_its_entry_point() -> None:
    assert "toy" not in [e.name for e in ENGINES]


def test_the_toy_engine_passes_the_conformance_suite(tmp_path: Path) -> None:
    path = os.pathsep.join([str(PLUGINS), str(REPO), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/engines/test_conformance.py",
         "tests/plan/test_set_reservations.py", "-k", "toy",
         "-q", "-n", "0", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed is not None and int(passed.group(1)) >= 20, run.stdout[-2000:]
    assert "failed" not in run.stdout and "error" not in run.stdout.lower().split("passed")[-1]
