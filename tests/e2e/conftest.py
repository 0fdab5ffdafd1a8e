"""The machine the end-to-end test boots: a fresh copy of the cached Debian rootfs
(tests/tools/rootfs.sh) with real systemd as PID 1 under systemd-nspawn, the real CPU vLLM
venv bind-mounted read-only at its host path, the tiny model copied to /srv/models/tiny (the
admin gives it to the group epyc-llm after install), and a clean copy of this repository at
/src that the container installs with packaging/install.sh.

Each boot runs one phase of tests/e2e/inside.py (a oneshot unit enabled in the rootfs) and
powers off; its observations come back as JSON lines in the bound results folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from epycd.events import MESSAGE_IDS
from tests.health.realvllm import (
    BOOTSTRAP_HINT,
    CACHE,
    STOCK_VLLM,
    VENV,
    tiny_model,
    vllm_executable,
)
from tests.hosts import CATALOGUE, write_host
from tests.machine import (
    FORCE_STOCK,
    physical_cpus,
    serving,
    serving_needs_identity,
    write_identity_root,
)
from tests.memcg import memcg_problem, oom_kill

REPO = Path(__file__).resolve().parents[2]
ROOTFS = CACHE / "rootfs"
PIP_CACHE = CACHE / "e2e-pip-cache"
HINT = "run tests/bootstrap.sh (tests/tools/rootfs.sh debootstraps the rootfs)"
NAME = "tiny"
NEVER = "never"
PORT = 18311
NEVER_PORT = 18312
METRICS_PORT = 9464
"""epycd's metrics_listen default: the machine shares this machine's network."""
PROMETHEUS_PORT = 19090
PROMETHEUS = CACHE / "prometheus" / "root" / "usr" / "bin"
FAKE_HOST = "/fakehost"
IDENTITY_ROOT = "/epyc-identity"
MODEL_DIR = "/srv/models/tiny"
"""The tiny model copied into the machine: the admin gives it to the group epyc-llm."""
PHASES = (
    "install",
    "reboot",
    "edited-reboot",
    "stopped-reboot",
    "crashloop-reboot",
    "fakehost-reboot",
)
BOOT_TIMEOUT_S = {"install": 1200, "reboot": 1200, "stopped-reboot": 1200, "crashloop-reboot": 900}
DEFAULT_BOOT_TIMEOUT_S = 600

DRIVER_UNIT = """\
[Unit]
Description=epyc-llm end-to-end driver (tests/e2e/inside.py)
After=basic.target network.target

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /opt/e2e/inside.py
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
"""


APT_SOURCE = "deb [trusted=yes] file:/var/cache/e2e-apt ./\n"
"""A bare machine's only apt source: a local repository bound there, as an admin's mirror."""


def require_parts(*parts: Path, hint: str) -> None:
    """systemd-nspawn, and each cached part finished (its stamp written)."""
    if shutil.which("systemd-nspawn") is None:
        pytest.fail(f"no systemd-nspawn: {hint}")
    for part in parts:
        if not (part / ".epyc-stamp").is_file():
            pytest.fail(f"{part} is not built: {hint}")


def fresh_copy(rootfs: Path, work: Path) -> tuple[Path, Path]:
    """A fresh copy of `rootfs` in WORK/rootfs and an empty results folder WORK/results."""
    root, results = work / "rootfs", work / "results"
    subprocess.run(["cp", "-a", "--reflink=auto", str(rootfs), str(root)], check=True)
    results.mkdir()
    return root, results


def drive_with(root: Path, script: str) -> None:
    """inside.py and `script` (its phases) in /opt/e2e, and the enabled oneshot driver unit
    that runs `script` at boot."""
    e2e = root / "opt" / "e2e"
    e2e.mkdir(parents=True, exist_ok=True)
    for name in ("inside.py", script):
        shutil.copy2(Path(__file__).with_name(name), e2e / name)
    units = root / "etc" / "systemd" / "system"
    driver = DRIVER_UNIT.replace("/opt/e2e/inside.py", f"/opt/e2e/{script}")
    (units / "e2e-driver.service").write_text(driver)
    wants = units / "multi-user.target.wants" / "e2e-driver.service"
    wants.parent.mkdir(parents=True, exist_ok=True)
    if not wants.is_symlink():
        wants.symlink_to("/etc/systemd/system/e2e-driver.service")


def offline_apt(root: Path) -> None:
    """The machine's apt reads only the local repository (`APT_SOURCE`)."""
    (root / "etc" / "apt" / "sources.list").write_text(APT_SOURCE)
    for source in (root / "etc" / "apt" / "sources.list.d").glob("*"):
        source.unlink()


MLOCK_AS_ON_A_HOST = ("--capability=CAP_IPC_LOCK",)
"""nspawn's flags for a machine whose engine units lock their weights as on a host: its seccomp
filter refuses mlock(2) unless the container keeps CAP_IPC_LOCK (a host has no such filter;
the endpoint's unit still drops every capability). What it cannot give: its PID 1 keeps the 8
MiB of locked memory the kernel gave the host's init (`--rlimit=RLIMIT_MEMLOCK=infinity`
notwithstanding, on this Debian 12 host), so a unit's LimitMEMLOCK=infinity stays 8 MiB there
and a larger model's weights are not locked ("failed to mlock 184786944-byte buffer" for the
published Gemma): the lock is checked on the tiny models, which fit in it."""


@contextlib.contextmanager
def kept_or_removed(work: Path) -> Iterator[None]:
    """WORK removed after the module's machine, or kept (EPYC_E2E_KEEP=1) to look into."""
    try:
        yield
    finally:
        if os.environ.get("EPYC_E2E_KEEP"):
            print(f"e2e: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def endpoint_toml(model: Path, vllm: Path, name: str, port: int) -> str:
    return f"""\
# written by tests/e2e: the tiny local model served by the host vLLM venv
model = "{model}"
runtime = "host"
vllm = "{vllm}"
socket = 0
port = {port}
max_model_len = 512
served_model_name = "{name}"
extra_args = ["--enforce-eager"]

[env]
HF_HUB_OFFLINE = "1"
VLLM_NO_USAGE_STATS = "1"
"""


def interpreter_home(venv: Path) -> Path | None:
    """The prefix of the interpreter the venv was made from, when it is not the system's."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip()).parent
            return None if home in (Path("/usr"), Path("/usr/local")) else home
    return None


def clean_copy(dest: Path) -> None:
    """The repository as a clone would have it (tracked and untracked, not ignored files)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@dataclass
class Boot:
    phase: str
    seconds: float
    records: list[dict[str, Any]]
    console: Path

    def all(self, check: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["check"] == check]

    def one(self, check: str) -> dict[str, Any]:
        found = self.all(check)
        assert found, f"{self.phase}: no {check!r} record; console: {self.console}"
        return found[-1]

    def assert_clean(self) -> None:
        errors = self.all("error") + self.all("timeout")
        assert not errors, f"{self.phase}: {errors}"
        assert self.all("done"), f"{self.phase}: the driver did not finish; see {self.console}"


REQUESTS = "requests"
"""The folder in a machine's results where its driver asks the host for what it cannot do
itself (HostHands), one `ID.json` request each, answered in `ID.done`."""


def host_pid(root: Path, pid: int) -> int | None:
    """This machine's pid of the process that is `pid` in the machine whose root is `root`
    (the last field of /proc/PID/status's NSpid; the root folder, by device and inode, tells
    machines apart: its path reads "/" from here, in the machine's own mount namespace)."""
    want = root.stat()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            seen = (entry / "root").stat()
        except OSError:
            continue
        if (seen.st_dev, seen.st_ino) != (want.st_dev, want.st_ino):
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == str(pid) and len(line.split()) > 2:
                return int(entry.name)
    return None


class HostHands:
    """While a machine runs, the host does for its driver what the machine cannot do itself:
    a kernel OOM kill of one of its processes over a memory cgroup's limit (the machine's
    cgroup hierarchies are mounted read-only in it; tests/memcg.py)."""

    def __init__(self, root: Path, results: Path) -> None:
        self.root = root
        self.folder = results / REQUESTS
        self.folder.mkdir(exist_ok=True)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.serve, name="host-hands", daemon=True)

    def __enter__(self) -> HostHands:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join()

    def serve(self) -> None:
        while not self.done.wait(0.2):
            for request in sorted(self.folder.glob("*.json")):
                answer = self.answer(json.loads(request.read_text()))
                request.with_suffix(".done").write_text(json.dumps(answer))
                request.unlink()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("action") != "oom_kill":
            return {"error": f"no such request: {request}"}
        pid = host_pid(self.root, int(request["pid"]))
        if pid is None:
            return {"error": f"no process {request['pid']} in the machine"}
        if (problem := memcg_problem()) is not None:
            return {"error": problem}
        killed = oom_kill(pid)
        return {"oom_kills": killed.oom_kills, "balloon": killed.balloon, "host_pid": pid}


@dataclass
class Machine:
    root: Path
    results: Path
    binds: list[str]
    boots: dict[str, Boot] = field(default_factory=dict)
    failed: str | None = None
    phases: tuple[str, ...] = PHASES

    def boot(self, phase: str) -> Boot:
        """Boot the phases up to `phase` (each once, in order) and return `phase`'s boot."""
        for earlier in self.phases[: self.phases.index(phase) + 1]:
            if earlier not in self.boots:
                if self.failed:
                    pytest.fail(f"an earlier boot ({self.failed}) did not finish")
                self.boots[earlier] = self._boot(earlier)
        return self.boots[phase]

    def _boot(self, phase: str) -> Boot:
        (self.results / "phase").write_text(phase + "\n")
        console = self.results / f"{phase}.console.log"
        argv = [
            "systemd-nspawn", "-D", str(self.root), "-b", "--console=pipe",
            "--register=no", "--keep-unit", *self.binds,
        ]  # fmt: skip
        timeout = BOOT_TIMEOUT_S.get(phase, DEFAULT_BOOT_TIMEOUT_S)
        started = time.monotonic()
        with console.open("wb") as log, HostHands(self.root, self.results):
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                self.failed = phase
                pytest.fail(f"boot {phase} did not power off within {timeout}s; see {console}")
        seconds = round(time.monotonic() - started, 1)
        out = self.results / f"{phase}.jsonl"
        records = (
            [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        )
        boot = Boot(phase, seconds, records, console)
        if not boot.all("done") or boot.all("error"):
            self.failed = f"{phase}: {boot.all('error') or 'no done record'}"
        timings = self.results / "timings.jsonl"
        with timings.open("a") as out_file:
            out_file.write(json.dumps({"phase": phase, "seconds": seconds}) + "\n")
        return boot


def require_tools() -> tuple[Path, Path]:
    if os.geteuid() != 0:
        pytest.fail("the end-to-end test boots containers with systemd-nspawn: run it as root")
    if shutil.which("systemd-nspawn") is None:
        pytest.fail(f"systemd-nspawn is missing: {HINT}")
    if not (ROOTFS / ".epyc-stamp").is_file():
        pytest.fail(f"no Debian rootfs in {ROOTFS}: {HINT}")
    vllm = vllm_executable()
    if not (VENV / "pyvenv.cfg").is_file():
        pytest.fail(f"no vLLM venv in {VENV}: {BOOTSTRAP_HINT}")
    if not (PROMETHEUS / "prometheus").is_file():
        pytest.fail(f"Debian's prometheus is missing ({PROMETHEUS}): run tests/bootstrap.sh")
    for port in (PORT, NEVER_PORT, METRICS_PORT, PROMETHEUS_PORT):
        if not port_free(port):
            pytest.fail(f"port {port} is in use on this machine; the container shares its network")
    return vllm, tiny_model()


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    vllm, model = require_tools()
    work = tmp_path_factory.mktemp("e2e")
    root, src, results = work / "rootfs", work / "src", work / "results"
    subprocess.run(["cp", "-a", "--reflink=auto", str(ROOTFS), str(root)], check=True)
    clean_copy(src)
    results.mkdir()
    PIP_CACHE.mkdir(parents=True, exist_ok=True)

    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    shutil.copytree(model, root / MODEL_DIR.lstrip("/"))
    (root / "opt" / "e2e").mkdir(parents=True)
    shutil.copy2(Path(__file__).with_name("inside.py"), root / "opt" / "e2e" / "inside.py")
    units = root / "etc" / "systemd" / "system"
    (units / "e2e-driver.service").write_text(DRIVER_UNIT)
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (units / "multi-user.target.wants" / "e2e-driver.service").symlink_to(
        "/etc/systemd/system/e2e-driver.service"
    )
    cores = len(physical_cpus())
    identity = None
    if serving_needs_identity():
        identity = IDENTITY_ROOT
        write_identity_root(root / IDENTITY_ROOT.lstrip("/"))
    fake = replace(
        CATALOGUE["this-machine-genoa-vm"], cores_per_socket=cores + 2, node_memory_gib=64.0
    )
    write_host(root / FAKE_HOST.lstrip("/"), fake)
    config = {
        "name": NAME,
        "never": NEVER,
        "port": PORT,
        "prometheus_port": PROMETHEUS_PORT,
        "served": NAME,
        "client_python": str(VENV / "bin" / "python"),
        "fake_host": FAKE_HOST,
        "identity_root": identity,
        "consent_args": serving(work, stock=FORCE_STOCK).consent_args,
        "fake_cores": cores + 2,
        "real_cores": cores,
        "model_dir": MODEL_DIR,
        "endpoint_toml": endpoint_toml(Path(MODEL_DIR), vllm, NAME, PORT),
        "never_toml": endpoint_toml(Path(MODEL_DIR), vllm, NEVER, NEVER_PORT).replace(
            "socket = 0\n", ""
        ),
        "edit": ["max_model_len = 512\n", "max_model_len = 512\nmax_num_seqs = 2\n"],
        "message_ids": {str(event): value for event, value in MESSAGE_IDS.items()},
    }
    (results / "config.json").write_text(json.dumps(config, indent=2))

    binds = [
        f"--bind-ro={src}:/src",
        f"--bind={results}:/results",
        f"--bind={PIP_CACHE}:/var/cache/e2e-pip",
        "--bind-ro=/etc/ssl/certs",
        f"--bind-ro={VENV}",
        f"--bind-ro={PROMETHEUS}:/opt/prometheus",
        *([f"--bind-ro={STOCK_VLLM}"] if FORCE_STOCK else []),
    ]
    home = interpreter_home(VENV)
    if home is not None:
        binds.append(f"--bind-ro={home}")
    yield Machine(root, results, binds)
    if os.environ.get("EPYC_E2E_KEEP"):
        print(f"e2e: kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def endpoint(status: dict[str, Any] | None, name: str) -> dict[str, Any]:
    assert status is not None, "epycctl status --json gave no JSON"
    entries = status.get("endpoints", [status])
    found = [e for e in entries if e.get("name") == name]
    assert found, f"{name} not in {entries}"
    entry: dict[str, Any] = found[0]
    return entry


def unit_log(boot: Boot, lines: int = 12) -> str:
    """The endpoint unit's last journal lines and node 0's memory: why it did not serve."""
    entries = boot.all("journal_serving")[-1]["entries"] if boot.all("journal_serving") else []
    messages = [str(e["message"]) for e in entries]
    errors = [m for m in messages if "Error:" in m][-lines // 2 :]
    tail = [*errors, *messages[-lines // 2 :]]
    memory = (boot.all("node_memory") or [{"nodes": {}}])[-1]["nodes"].get("node0", "")
    free = [line for line in memory.splitlines() if "MemTotal" in line or "MemFree" in line]
    return "\n".join([*tail, *free])
