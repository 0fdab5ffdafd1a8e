"""The real product in a subprocess, and the folders it runs in.

`run_python` is the one way a test runs the product's interpreter to completion
(`python -m epycd ...`, `-m epycd.approval.check`, a `-c` probe): from the repository, with
the environment the caller built, output captured as text, stdin closed unless given, never
raising on a non-zero exit, and optionally as another user (setpriv) or under another umask.

`CliSandbox` is every EPYCD_* folder in a temporary directory, a `bin/` folder first on
PATH (where a fake `systemctl` goes, since systemd is not PID 1 here) and the environment
for the real CLI. The approval tests (`tests/approval/conftest.py`, `ApprovalSandbox`) and
the status/daemon tests (`tests/daemon/conftest.py`, `DaemonSandbox`) extend it; the
quickstart tests use it as it is. In-process planner tests use `tests.plan.conftest.
PlanWorkspace` instead: no subprocess, no environment.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epycd.settings import Settings
from tests.hosts import make_host

REPO = Path(__file__).resolve().parents[1]
EPYCD_DIRS = ("config_dir", "state_dir", "run_dir", "unit_dir", "quadlet_dir")
SYSTEM_BIN = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

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


def run_python(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    user: int | None = None,
    groups: Sequence[int] = (),
    umask: int = -1,
    stdin: str | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`python ARGV` from the repository; as uid/gid `user` (supplementary `groups`, else
    none) when given; `umask` in the child when not -1."""
    prefix: list[str] = []
    if user is not None:
        group_args = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", *group_args]
    return subprocess.run(
        [*prefix, sys.executable, *argv],
        env=dict(env),
        cwd=REPO,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        umask=umask,
    )


def make_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@dataclass
class CliSandbox:
    """Every EPYCD_* folder in `tmp`; `vars` are the EPYCD_* (and HF_*) variables the
    product sees; PATH is `bin_dir`, then `search_path`."""

    tmp: Path
    vars: dict[str, str]
    bin_dir: Path
    search_path: tuple[str, ...] = field(
        default_factory=lambda: tuple(os.environ.get("PATH", "/usr/bin:/bin").split(":"))
    )
    cli_module: str = "epycd"

    @classmethod
    def create(cls, base: Path, **variables: str) -> CliSandbox:
        for key in EPYCD_DIRS:
            (base / key).mkdir(parents=True)
        (base / "bin").mkdir()
        folders = {f"EPYCD_{key.upper()}": str(base / key) for key in EPYCD_DIRS}
        # a daemon a test runs serves no metrics unless the test says where: the default
        # port is this machine's, and the e2e machines share its network
        quiet = {"EPYCD_METRICS_LISTEN": ""}
        return cls(tmp=base, vars=folders | quiet | variables, bin_dir=base / "bin")

    @property
    def host_root(self) -> Path:
        return Path(self.vars.get("EPYCD_HOST_ROOT", "/"))

    @property
    def settings(self) -> Settings:
        folders = {key: Path(self.vars[f"EPYCD_{key.upper()}"]) for key in EPYCD_DIRS}
        return Settings.model_validate(folders | {"host_root": self.host_root})

    @property
    def systemctl_log(self) -> Path:
        return self.tmp / "systemctl.log"

    def use_fake_host(self, name: str = "this-machine-genoa-vm") -> Path:
        root = make_host(self.tmp / "hosts", name)
        self.vars["EPYCD_HOST_ROOT"] = str(root)
        return root

    def environ(self, *, system_path: bool = True, **extra: str) -> dict[str, str]:
        """The caller's environment without its EPYCD_*/SUDO_* variables, then ours;
        `system_path=False` leaves only `bin_dir` on PATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EPYCD_", "SUDO_"))}
        env.update(self.vars)
        env["PATH"] = ":".join([str(self.bin_dir), *(self.search_path if system_path else ())])
        # the repository, then the caller's (an engine's entry point: tests/engines/plugins)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env["FAKE_SYSTEMCTL_LOG"] = str(self.systemctl_log)
        env.update(extra)
        return env

    def epycctl(
        self,
        *args: str,
        module: str | None = None,
        system_path: bool = True,
        user: int | None = None,
        groups: Sequence[int] = (),
        umask: int = -1,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        **extra: str,
    ) -> subprocess.CompletedProcess[str]:
        """The CLI (`cli_module`, or `module`) in a subprocess; `env` and `extra` are added
        variables (`env` for a mapping a caller passes on)."""
        return run_python(
            ["-m", module or self.cli_module, *args],
            env=self.environ(system_path=system_path, **extra) | dict(env or {}),
            user=user,
            groups=groups,
            umask=umask,
            stdin=stdin,
        )

    def install_fake_systemctl(self, script: str = FAKE_SYSTEMCTL) -> None:
        make_executable(self.bin_dir / "systemctl", script)

    def systemctl_calls(self) -> list[str]:
        log = self.systemctl_log
        return log.read_text().splitlines() if log.exists() else []

    def written(self) -> list[Path]:
        """Every file under the product's folders (the config, state, run and unit ones)."""
        return sorted(
            path
            for key in EPYCD_DIRS
            for path in Path(self.vars[f"EPYCD_{key.upper()}"]).rglob("*")
            if path.is_file() and path.name != "vllm-probes.json"
        )
