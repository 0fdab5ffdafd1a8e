from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from epycd.plan.model import Plan
from epycd.settings import Settings
from tests.approval.plans import PLAN_FILE_ENV, write_plan_file
from tests.hosts import make_host

REPO = Path(__file__).resolve().parents[2]
EPYCD_DIRS = ("config_dir", "state_dir", "run_dir", "unit_dir", "quadlet_dir")

FAKE_SYSTEMCTL = """#!/bin/sh
# Records its argv; answers like systemctl. Used only because systemd is not PID 1 here.
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
case "$1" in
  is-active) a=${FAKE_ACTIVE:-inactive}; echo "$a"; [ "$a" = active ] || exit 3 ;;
  is-enabled) e=${FAKE_ENABLED:-disabled}; echo "$e"; [ "$e" = enabled ] || exit 1 ;;
  "$FAKE_SYSTEMCTL_FAIL") echo "Failed to $1: Unit not found." >&2; exit 5 ;;
esac
exit 0
"""


@dataclass
class Env:
    """All EPYCD_* folders in a temporary directory, a fake host root, and the environment
    for running the real `epycctl` in a subprocess."""

    tmp: Path
    vars: dict[str, str]
    host_root: Path
    plan_file: Path
    systemctl_log: Path
    bin_dir: Path
    plans: dict[str, Plan] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        folder = {key: Path(self.vars[f"EPYCD_{key.upper()}"]) for key in EPYCD_DIRS}
        return Settings(
            config_dir=folder["config_dir"],
            state_dir=folder["state_dir"],
            run_dir=folder["run_dir"],
            unit_dir=folder["unit_dir"],
            quadlet_dir=folder["quadlet_dir"],
            host_root=self.host_root,
        )

    def host(self, root: Path | None = None) -> HostFacts:
        return detect_host(root or self.host_root, probe_runtimes=False)

    def set_plans(self, *plans: Plan) -> None:
        self.plans = {plan.endpoint: plan for plan in plans}
        for plan in plans:
            Path(plan.config_file).write_text(f'model = "{plan.model}"\n')
        write_plan_file(self.plan_file, self.plans, self.host())

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EPYCD_", "SUDO_"))}
        env.update(self.vars)
        env["PATH"] = f"{self.bin_dir}:{env['PATH']}"
        env["PYTHONPATH"] = str(REPO)
        env[PLAN_FILE_ENV] = str(self.plan_file)
        env["FAKE_SYSTEMCTL_LOG"] = str(self.systemctl_log)
        env.update(extra)
        return env

    def epycctl(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        """The real CLI in a subprocess, the planner replaced by `set_plans` (driver.py)."""
        return subprocess.run(
            [sys.executable, "-m", "tests.approval.driver", *args],
            env=self.environ(**extra),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def systemctl_calls(self) -> list[str]:
        if not self.systemctl_log.exists():
            return []
        return self.systemctl_log.read_text().splitlines()

    def install_fake_systemctl(self) -> None:
        path = self.bin_dir / "systemctl"
        path.write_text(FAKE_SYSTEMCTL)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_env(base: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    variables = {}
    for key in EPYCD_DIRS:
        folder = base / key
        folder.mkdir()
        variables[f"EPYCD_{key.upper()}"] = str(folder)
    host_root = make_host(base / "hosts", "genoa-9654-2s-nps1")
    variables["EPYCD_HOST_ROOT"] = str(host_root)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EPYCD_ADMIN_GROUP", raising=False)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    return Env(
        tmp=base,
        vars=variables,
        host_root=host_root,
        plan_file=base / "plans.json",
        systemctl_log=base / "systemctl.log",
        bin_dir=bin_dir,
    )


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    yield make_env(tmp_path, monkeypatch)
