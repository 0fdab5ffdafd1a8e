"""A real systemd (252) service manager as the round-trip oracle for rendered units.

`systemd --user` runs fine without systemd as PID 1 once it sees /run/systemd/system; that
folder is given to it on a tmpfs in a private mount namespace (`unshare -m`), so the machine
is not changed. The units under test run an argv dumper in place of the product's Python:
it records the argv, environment, CPU affinity and the HF token it can read, exactly as
systemd hands them over after unquoting, unescaping, specifier and `$` expansion.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SYSTEMD = next(
    (p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.access(p, os.X_OK)),
    "/lib/systemd/systemd",
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PR_SET_PDEATHSIG = 1
LOG_LEVEL = os.environ.get("EPYC_MANAGER_LOG", "warning")

DUMPER = """#!{python}
import json, os, resource, sys, time, uuid
import sdnotify
record = {{
    "argv": sys.argv,
    "env": dict(os.environ),
    "cpus": sorted(os.sched_getaffinity(0)),
    "cwd": os.getcwd(),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
    "memlock": resource.getrlimit(resource.RLIMIT_MEMLOCK),
    "cgroup": open("/proc/self/cgroup", encoding="utf-8").read(),
}}
token_path = os.environ.get("HF_TOKEN_PATH")
if token_path and os.path.exists(token_path):
    with open(token_path, encoding="utf-8") as handle:
        record["token"] = handle.read()
with open(os.path.join({dumps!r}, uuid.uuid4().hex + ".json"), "w", encoding="utf-8") as out:
    json.dump(record, out)
sdnotify.SystemdNotifier().notify("READY=1")
time.sleep(0.3)
"""


@dataclass
class Run:
    description: str
    result: str
    records: list[dict[str, Any]]


class UserManager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.units = root / "config" / "systemd" / "user"
        self.dumps = root / "dumps"
        self.dumper = root / "bin" / "argv-dumper"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root / "home"),
            "XDG_RUNTIME_DIR": str(root / "run"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_CACHE_HOME": str(root / "cache"),
            "XDG_DATA_HOME": str(root / "data"),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.refused: frozenset[str] | None = None
        """Sandbox directives this machine refuses (tests.render.oracle.refused_here)."""
        self.cgroup = f"epyc-render-test-{os.getpid()}-{root.name}"

    def start(self) -> None:
        for folder in ("home", "run", "state", "cache", "data", "bin"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        (self.root / "run").chmod(0o700)
        self.units.mkdir(parents=True, exist_ok=True)
        self.dumps.mkdir(parents=True, exist_ok=True)
        self.dumper.write_text(DUMPER.format(python=sys.executable, dumps=str(self.dumps)))
        self.dumper.chmod(0o755)
        if shutil.which("unshare") is None or not os.access(SYSTEMD, os.X_OK):
            pytest.fail("unshare and systemd are needed: run tests/bootstrap.sh (as root)")
        script = (
            "mount -t tmpfs epyc-test /run && mkdir -p /run/systemd/system && "
            f"exec {SYSTEMD} --user --log-target=console --log-level={LOG_LEVEL}"
        )
        self.log = (self.root / "manager.log").open("wb")
        try:
            self.process = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                env=self.env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                preexec_fn=self._enter_own_cgroup,
            )
        except subprocess.SubprocessError as error:
            pytest.fail(f"cannot give systemd --user a cgroup of its own (needs root): {error}")
        private = self.root / "run" / "systemd" / "private"
        deadline = time.monotonic() + 20
        while not private.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.root / "manager.log").read_text(errors="replace")
                pytest.fail(f"systemd --user did not start (needs root and unshare):\n{log}")
            time.sleep(0.02)

    def _cgroup_dirs(self) -> list[Path]:
        unified = CGROUP_ROOT / "cgroup.controllers"
        if unified.exists():
            return [CGROUP_ROOT / self.cgroup]
        hierarchies = {h.resolve() for h in CGROUP_ROOT.iterdir() if h.is_dir()}
        return [h / self.cgroup for h in sorted(hierarchies) if (h / "cgroup.procs").exists()]

    def _enter_own_cgroup(self) -> None:
        """Runs in the child before exec: the manager gets a cgroup of its own.

        A systemd manager moves every process of its root cgroup into its init.scope; in a
        cgroup of its own that is only itself, and nothing else on the machine is touched.
        It also ends with the test process that started it, even when that one is killed.
        """
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        for folder in self._cgroup_dirs():
            folder.mkdir(exist_ok=True)
            for cpuset in ("cpuset.cpus", "cpuset.mems"):
                if (folder / cpuset).exists() and not (folder / cpuset).read_text().strip():
                    (folder / cpuset).write_text((folder.parent / cpuset).read_text())
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        left = []
        for folder in self._cgroup_dirs():
            if not folder.exists():
                continue
            for sub, _dirs, _files in os.walk(folder, topdown=False):
                try:
                    os.rmdir(sub)
                except OSError:
                    left.append(sub)
        assert not left, f"cgroups still in use after the manager stopped: {left}"

    def systemctl(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            ["systemctl", "--user", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            log = (self.root / "manager.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"systemctl {' '.join(args)}: {result.stderr}\n{log}")
        return result.stdout

    def install(self, units: dict[str, str]) -> None:
        for old in self.units.iterdir():
            old.unlink()
        for name, text in units.items():
            (self.units / name).write_text(text, encoding="utf-8")
        self.systemctl("daemon-reload")

    def run_all(self, units: list[str]) -> dict[str, Run]:
        """Start the units together, wait until all have finished, return what each received."""
        for old in self.dumps.iterdir():
            old.unlink()
        self.systemctl("start", *units, check=False)
        deadline = time.monotonic() + 60
        while any(
            state in ("active", "activating", "deactivating")
            for state in self.systemctl("is-active", *units, check=False).split()
        ):
            if time.monotonic() > deadline:
                raise AssertionError(f"{units} did not finish")
            time.sleep(0.02)
        records = [json.loads(p.read_text()) for p in sorted(self.dumps.iterdir())]
        runs = {}
        for unit in units:
            show = self.systemctl("show", unit, "-p", "Description", "-p", "Result")
            props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
            mine = [r for r in records if _unit_of(r) == unit]
            runs[unit] = Run(props["Description"], props["Result"], mine)
        self.systemctl("reset-failed", *units, check=False)
        return runs


def _unit_of(record: dict[str, Any]) -> str:
    """The unit a dumped process ran in, from its cgroup (control processes sit below it)."""
    for line in str(record["cgroup"]).splitlines():
        _id, controllers, path = line.split(":", 2)
        if controllers in ("name=systemd", ""):
            units = [part for part in path.split("/") if part.endswith(".service")]
            return units[-1] if units else ""
    return ""
