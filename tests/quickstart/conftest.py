from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from epycd.settings import Settings
from tests.approval.conftest import FAKE_SYSTEMCTL
from tests.health.realvllm import vllm_executable
from tests.hosts import make_host

REPO = Path(__file__).resolve().parents[2]
EPYCD_DIRS = ("config_dir", "state_dir", "run_dir", "unit_dir", "quadlet_dir")
SYSTEM_BIN = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass
class Sandbox:
    """Every EPYCD_* folder and HF_HOME in a temporary directory; the real `epycctl` runs in
    a subprocess with a PATH of our choosing (first `bin_dir`, then the system's)."""

    tmp: Path
    vars: dict[str, str]
    bin_dir: Path

    @property
    def settings(self) -> Settings:
        folders = {key: Path(self.vars[f"EPYCD_{key.upper()}"]) for key in EPYCD_DIRS}
        return Settings.model_validate(
            folders | {"host_root": Path(self.vars.get("EPYCD_HOST_ROOT", "/"))}
        )

    def environ(
        self, *, system_path: bool = True, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EPYCD_", "SUDO_"))}
        env.update(self.vars)
        path = [str(self.bin_dir), *(SYSTEM_BIN if system_path else ())]
        env["PATH"] = ":".join(path)
        env["PYTHONPATH"] = str(REPO)
        env["FAKE_SYSTEMCTL_LOG"] = str(self.tmp / "systemctl.log")
        env.update(extra or {})
        return env

    def epycctl(
        self, *args: str, system_path: bool = True, extra: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "epycd", *args],
            env=self.environ(system_path=system_path, extra=extra),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def use_fake_host(self, name: str = "this-machine-genoa-vm") -> Path:
        root = make_host(self.tmp / "hosts", name)
        self.vars["EPYCD_HOST_ROOT"] = str(root)
        return root

    def install_fake_systemctl(self) -> None:
        """Only for the start call: systemd is not PID 1 here."""
        path = self.bin_dir / "systemctl"
        path.write_text(FAKE_SYSTEMCTL)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def systemctl_calls(self) -> list[str]:
        log = self.tmp / "systemctl.log"
        return log.read_text().splitlines() if log.exists() else []

    def written(self) -> list[Path]:
        """Every file under the product's folders (the config, state, run and unit ones)."""
        return sorted(
            path
            for key in EPYCD_DIRS
            for path in Path(self.vars[f"EPYCD_{key.upper()}"]).rglob("*")
            if path.is_file() and path.name != "vllm-probes.json"
        )


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    variables = {}
    for key in EPYCD_DIRS:
        folder = tmp_path / key
        folder.mkdir()
        variables[f"EPYCD_{key.upper()}"] = str(folder)
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    variables |= {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return Sandbox(tmp_path, variables, bin_dir)


def real_vllm() -> Path:
    return vllm_executable()
