"""The container paths as an admin meets them: real systemd as PID 1 in systemd-nspawn, podman
5.4 with Quadlet in Debian trixie (systemd 257) and Debian's docker.io 20.10 in bookworm
(systemd 252, the supervisor's READY=1), the local vLLM CPU image
(tests/tools/vllm_image.sh) and the tiny model in a Hugging Face cache. Each runtime serves
one route (`Engine.route`), so both run for real on every machine: podman the machine's own
with the test image the file names (zentorch where the CPU has AVX-512 BF16, else vLLM's
stock platform; unvalidated, consent), docker a Milan's stock route (a Milan identity unless
the CPU is one; no image in the file, so the stock image the product picks, whose local
stand-in runs `vllm serve` with zentorch hidden). Three boots of one
copy of the cached rootfs (tests/tools/engine_rootfs.sh), each running one phase of
tests/e2e/inside_containers.py:

install         approve --no-pull -> `activating` until podman's health check passes
                (Notify=healthy) -> `active`; the container's CPUs, memory nodes, cgroup
                cpuset and NUMA bind; the HF cache mount; a chat; status ready with the URL
reboot          back with no new approval; `epycctl export kube` (podman); `epycctl stop`
stopped-reboot  not started at boot; `epycctl remove` removes the container; the exported
                Deployment under `podman kube play` (podman): limits in its cgroups, a chat;
                an absent image with --no-pull fails once, clearly

What nesting the engines in nspawn needed on these machines, and why (the least found to work):
- Hybrid cgroups on the host (v1 controllers; the cgroup2 tree has no controllers, a
  controller lives in one hierarchy only). systemd 257 would take a v2 tree without any
  controller, and crun then fails ("controller `pids` is not available"): the machine boots
  systemd in legacy mode instead (`systemd.unified_cgroup_hierarchy=0
  SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1`, read from PID 1's own argv in a container).
- nspawn mounts the v1 controllers read-only: the host's hierarchies are bound in at
  /opt/cg/C and mounted over /sys/fs/cgroup/C by a unit before sysinit.target, so crun can
  create the container's cgroups and write cpuset.cpus/cpuset.mems; podman uses the
  cgroupfs manager (with systemd's, crun could not write cpuset.cpus: "Permission denied").
- nspawn's syscall filter refuses keyctl ("crun: create keyring: Operation not permitted",
  runc: "unable to join session keyring"): podman is told `keyring = false` in
  containers.conf; docker has no such setting, so its machine allows the @keyring calls.
- Capabilities: nspawn's default set (it keeps CAP_SYS_ADMIN, CAP_SYS_NICE, ...) is enough
  for podman; dockerd also needs CAP_NET_ADMIN even for host-network containers ("failed to
  create default sandbox: operation not permitted" without it). No `--capability=all`.
- Without CAP_SYS_RESOURCE in the sandbox (a hard RLIMIT_NOFILE/MEMLOCK below the unit's),
  crun cannot raise the container's rlimits ("setrlimit RLIMIT_NOFILE: Operation not
  permitted"): only then a Quadlet drop-in (podman) or a `docker` wrapper ahead on PATH
  lowers them to the hard limits the machine allows.
- `podman kube play` needs catatonit for its pods' infra containers (a package podman
  recommends) and a pod network, which needs CAP_NET_ADMIN: the played Deployment gets
  `hostNetwork: true`, its one change. Without CAP_SYS_RESOURCE, containers.conf's
  default_ulimits lower the played container's rlimits as the drop-in does the units'.
- The image lives in the cache as a podman store, mounted read-only as an additional
  image store (no 3.5 GB copy per run); docker loads the cached docker-archive (about 40-85 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from epycd.host.cpulist import parse_cpulist
from epycd.stack import shipped_stack
from tests.e2e.conftest import (
    DRIVER_UNIT,
    Boot,
    clean_copy,
    endpoint,
    interpreter_home,
    port_free,
    unit_log,
)
from tests.health.realvllm import CACHE, VENV
from tests.machine import E2eRoute, Serving, e2e_route, write_identity_root

pytestmark = pytest.mark.e2e

CRASH_LOOP_RUNS = 3
"""epycd.plan.healing: failed runs that make a crash loop."""

IMAGE_DIR = CACHE / "vllm-image"
STACK = shipped_stack()
IMAGE = "localhost/epyc-llm-test/vllm-cpu:0.32.0"
ABSENT_IMAGE = "localhost/epyc-llm-test/absent:0"
MODEL = "epyc-llm-test/tiny"
HINT = "run tests/tools/engine_rootfs.sh and tests/tools/vllm_image.sh (or tests/bootstrap.sh)"
NAME = "tiny"
ABSENT = "ghost"
PORT = 18411
ABSENT_PORT = 18412
UNIT = f"epyc-llm-{NAME}.service"
URL = f"http://127.0.0.1:{PORT}/v1"
IDENTITY_ROOT = "/epyc-identity"
PHASES = ("install", "reboot", "stopped-reboot")
BOOT_TIMEOUT_S = 1200
CONTROLLERS = ("cpuset", "cpu", "cpuacct", "memory", "devices", "freezer", "blkio", "pids")
LEGACY_CGROUPS = ("systemd.unified_cgroup_hierarchy=0", "SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1")
CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class Engine:
    """What differs between the container paths, as the machine and the tests see it."""

    name: str
    rootfs: Path
    version: str
    unit_file: str
    notify_access: str
    cgroup_marker: str
    route: Literal["native", "stock"]
    """The vLLM route it serves (tests/machine.py `e2e_route`): podman the machine's own
    with the test image, docker a Milan's stock route with the stock image's stand-in, so
    that both routes run for real on every machine."""
    nspawn_args: tuple[str, ...] = ()

    @property
    def image(self) -> str:
        """What the plan must run: the test image the file names, or on the stock route
        the stock image the product picks itself (tests/tools/vllm_image.sh tags a stand-in)."""
        return IMAGE if self.route == "native" else STACK.stock_image_pinned


ENGINES = {
    "podman": Engine(
        name="podman",
        rootfs=CACHE / "rootfs-trixie-podman",
        version="podman version 5.",
        unit_file=f"/etc/containers/systemd/epyc-llm-{NAME}.container",
        notify_access="all",
        cgroup_marker="libpod",
        route="native",
    ),
    "docker": Engine(
        name="docker",
        rootfs=CACHE / "rootfs-bookworm-docker",
        version="Docker version 20.10",
        unit_file=f"/etc/systemd/system/{UNIT}",
        notify_access="main",
        cgroup_marker="docker",
        route="stock",
        nspawn_args=("--system-call-filter=@keyring", "--capability=CAP_NET_ADMIN"),
    ),
}

CGROUPS_SCRIPT = f"""#!/bin/sh
# the host's v1 controllers, writable, where crun looks for them (see test_containers.py)
set -e
mount -o remount,rw /sys/fs/cgroup
for c in {" ".join(CONTROLLERS)}; do
    [ -d /opt/cg/$c ] || continue
    mkdir -p /sys/fs/cgroup/$c
    umount /sys/fs/cgroup/$c 2>/dev/null || true
    mount --bind /opt/cg/$c /sys/fs/cgroup/$c
done
"""
CGROUPS_UNIT = """\
[Unit]
Description=test machine: writable v1 cgroup controllers for nested containers
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/opt/e2e/cgroups.sh

[Install]
WantedBy=sysinit.target
"""
CONTAINERS_CONF = '[containers]\nkeyring = false\n\n[engine]\ncgroup_manager = "cgroupfs"\n'
DOCKER_DAEMON = '{"bridge": "none", "iptables": false, "ip-forward": false}\n'
DOCKER_RLIMITS = """#!/bin/sh
# test machine: this sandbox cannot raise rlimits (no CAP_SYS_RESOURCE); the container's
# are lowered to the hard limits it allows (see tests/e2e/test_containers.py)
for arg in "$@"; do
    shift
    case "$arg" in
        --ulimit=nofile=*) arg="--ulimit=nofile={nofile}:{nofile}" ;;
        --ulimit=memlock=*) arg="--ulimit=memlock={memlock}:{memlock}" ;;
    esac
    set -- "$@" "$arg"
done
exec /usr/bin/docker "$@"
"""
STORAGE_CONF = f"""\
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"

[storage.options]
additionalimagestores = ["{IMAGE_DIR / "store"}"]
"""


def endpoint_toml(name: str, runtime: str, image: str | None, port: int) -> str:
    named = f'image = "{image}"\n' if image else ""
    return f"""\
# written by tests/e2e/test_containers.py: the tiny model from the HF cache, in the local image
model = "{MODEL}"
runtime = "{runtime}"
{named}socket = 0
port = {port}
max_model_len = 512
served_model_name = "{name}"
extra_args = ["--enforce-eager"]

[env]
HF_HUB_OFFLINE = "1"
VLLM_NO_USAGE_STATS = "1"
"""


def sandbox_rlimits() -> tuple[int, int] | None:
    """This machine's hard RLIMIT_NOFILE and RLIMIT_MEMLOCK where the sandbox cannot raise
    them (no CAP_SYS_RESOURCE in the bounding set): the container's must not exceed them."""
    bounding = int(
        next(
            line.split()[1]
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("CapBnd:")
        ),
        16,
    )
    if bounding >> CAP_SYS_RESOURCE & 1:
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(
        resource.RLIMIT_MEMLOCK
    )[1]


@dataclass
class EngineMachine:
    root: Path
    results: Path
    argv: list[str]
    boots: dict[str, Boot] = field(default_factory=dict)
    failed: str | None = None

    def boot(self, phase: str) -> Boot:
        for earlier in PHASES[: PHASES.index(phase) + 1]:
            if earlier not in self.boots:
                if self.failed:
                    pytest.fail(f"an earlier boot ({self.failed}) did not finish")
                self.boots[earlier] = self._boot(earlier)
        return self.boots[phase]

    def _boot(self, phase: str) -> Boot:
        (self.results / "phase").write_text(phase + "\n")
        console = self.results / f"{phase}.console.log"
        started = time.monotonic()
        with console.open("wb") as log:
            process = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                process.wait(BOOT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                self.failed = phase
                pytest.fail(f"boot {phase} did not power off in {BOOT_TIMEOUT_S}s; see {console}")
        seconds = round(time.monotonic() - started, 1)
        out = self.results / f"{phase}.jsonl"
        lines = out.read_text().splitlines() if out.exists() else []
        boot = Boot(phase, seconds, [json.loads(line) for line in lines], console)
        if not boot.all("done") or boot.all("error"):
            self.failed = f"{phase}: {boot.all('error') or 'no done record'}"
        with (self.results / "timings.jsonl").open("a") as timings:
            timings.write(json.dumps({"phase": phase, "seconds": seconds}) + "\n")
        return boot


def require_tools(engine: Engine) -> None:
    if os.geteuid() != 0:
        pytest.fail("the container end-to-end test boots systemd-nspawn: run it as root")
    if shutil.which("systemd-nspawn") is None:
        pytest.fail(f"systemd-nspawn is missing: {HINT}")
    for stamp in (engine.rootfs / ".epyc-stamp", IMAGE_DIR / ".epyc-stamp", VENV / ".epyc-stamp"):
        if not stamp.is_file():
            pytest.fail(f"no {stamp.parent}: {HINT}")
    if not Path("/sys/fs/cgroup/cpuset/cpuset.cpus").is_file():
        pytest.skip("this recipe binds the host's v1 cgroup controllers; the host has none")
    for port in (PORT, ABSENT_PORT):
        if not port_free(port):
            pytest.fail(f"port {port} is in use on this machine; the container shares its network")


def cgroup_dirs() -> set[Path]:
    """The host's v1 cgroups in the controllers the machine is given."""
    found: set[Path] = set()
    for controller in CONTROLLERS:
        for folder, _, _ in os.walk(f"/sys/fs/cgroup/{controller}"):
            found.add(Path(folder))
    return found


def remove_new_cgroups(before: set[Path]) -> None:
    """The engines made their cgroups in the host's hierarchies: remove those left empty
    (rmdir refuses a cgroup that still has processes or children)."""
    for folder in sorted(cgroup_dirs() - before, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()


def write_machine(root: Path, work: Path, config: dict[str, Any], route: E2eRoute) -> None:
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    e2e = root / "opt" / "e2e"
    e2e.mkdir(parents=True)
    here = Path(__file__).parent
    for script in ("inside.py", "inside_containers.py"):
        shutil.copy2(here / script, e2e / script)
    (e2e / "cgroups.sh").write_text(CGROUPS_SCRIPT)
    (e2e / "cgroups.sh").chmod(0o755)
    units = root / "etc" / "systemd" / "system"
    driver = DRIVER_UNIT.replace("/opt/e2e/inside.py", "/opt/e2e/inside_containers.py")
    for unit, text, target in (
        ("e2e-driver.service", driver, "multi-user.target"),
        ("e2e-cgroups.service", CGROUPS_UNIT, "sysinit.target"),
    ):
        (units / unit).write_text(text)
        (units / f"{target}.wants").mkdir(parents=True, exist_ok=True)
        (units / f"{target}.wants" / unit).symlink_to(f"/etc/systemd/system/{unit}")
    (units / "epycd.service.d").mkdir(parents=True)
    (units / "epycd.service.d" / "offline.conf").write_text(
        "[Service]\nEnvironment=HF_HUB_OFFLINE=1\n"
    )
    SETUP[config["engine"]](root)
    if route.identity is not None:
        write_identity_root(root / IDENTITY_ROOT.lstrip("/"), route.identity)
    # a copy (1.3 MB), not a bind: huggingface_hub may write locks into the cache
    shutil.copytree(IMAGE_DIR / "hf-cache", root / "root" / ".cache" / "huggingface", symlinks=True)


def set_up_podman(root: Path) -> None:
    """cgroupfs, no keyring, the cached image as a read-only store; rlimits the sandbox
    allows (a drop-in for the units, default_ulimits for `podman kube play`)."""
    containers = root / "etc" / "containers"
    limits = sandbox_rlimits()
    conf = CONTAINERS_CONF
    if limits is not None:
        nofile, memlock = limits
        conf = conf.replace(
            "[containers]\n",
            f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", '
            f'"memlock={memlock}:{memlock}"]\n',
        )
    (containers / "containers.conf").write_text(conf)
    (containers / "storage.conf").write_text(STORAGE_CONF)
    if limits is not None:
        drop_in = (
            "[Container]\n"
            f"PodmanArgs=--ulimit=nofile={nofile}:{nofile} --ulimit=memlock={memlock}:{memlock}\n"
        )
        for name in (NAME, ABSENT):
            folder = containers / "systemd" / f"epyc-llm-{name}.container.d"
            folder.mkdir(parents=True)
            (folder / "sandbox-rlimits.conf").write_text(drop_in)


def set_up_docker(root: Path) -> None:
    """No bridge and no iptables (the endpoints use the host network); where the sandbox
    cannot raise rlimits, a `docker` on systemd's PATH ahead of /usr/bin lowers the unit's
    --ulimit values to what it allows (the unit's docker run has no drop-in point)."""
    (root / "etc" / "docker").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "docker" / "daemon.json").write_text(DOCKER_DAEMON)
    limits = sandbox_rlimits()
    if limits is not None:
        wrapper = root / "usr" / "local" / "bin" / "docker"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(DOCKER_RLIMITS.format(nofile=limits[0], memlock=limits[1]))
        wrapper.chmod(0o755)


SETUP = {"podman": set_up_podman, "docker": set_up_docker}


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> Engine:
    return ENGINES[request.param]


@pytest.fixture(scope="module")
def engine_machine(
    engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineMachine]:
    require_tools(engine)
    work = tmp_path_factory.mktemp(f"e2e-{engine.name}")
    root, src, results = work / "rootfs", work / "src", work / "results"
    subprocess.run(["cp", "-a", "--reflink=auto", str(engine.rootfs), str(root)], check=True)
    clean_copy(src)
    results.mkdir()
    route = e2e_route(engine.route, work)
    config = {
        "engine": engine.name,
        "unit_file": engine.unit_file,
        "name": NAME,
        "never": "never",
        "absent": ABSENT,
        "port": PORT,
        "served": NAME,
        "client_python": str(VENV / "bin" / "python"),
        "identity_root": IDENTITY_ROOT if route.identity is not None else None,
        "consent_args": route.serving.consent_args,
        "backend": container_backend(route.serving),
        "endpoint_toml": endpoint_toml(
            NAME, engine.name, IMAGE if engine.route == "native" else None, PORT
        ),
        "absent_toml": endpoint_toml(ABSENT, engine.name, ABSENT_IMAGE, ABSENT_PORT),
        "restart_watch_s": 120,
    }
    (results / "config.json").write_text(json.dumps(config, indent=2))
    write_machine(root, work, config, route)
    binds = [
        f"--bind-ro={src}:/src",
        f"--bind={results}:/results",
        "--bind-ro=/etc/ssl/certs",
        f"--bind-ro={VENV}",
        f"--bind-ro={IMAGE_DIR / 'store'}",
        f"--bind-ro={IMAGE_DIR / 'image.tar'}:/opt/image/image.tar",
        *(f"--bind=/sys/fs/cgroup/{c}:/opt/cg/{c}" for c in CONTROLLERS),
    ]
    home = interpreter_home(VENV)
    if home is not None:
        binds.append(f"--bind-ro={home}")
    argv = [
        "systemd-nspawn", "-D", str(root), "-b", "--console=pipe", "--register=no",
        "--keep-unit", f"--machine=epyc-e2e-{engine.name}",
        *engine.nspawn_args, *binds,
        "--", *LEGACY_CGROUPS,
    ]  # fmt: skip
    before = cgroup_dirs()
    yield EngineMachine(root, results, argv)
    remove_new_cgroups(before)
    if os.environ.get("EPYC_E2E_KEEP"):
        print(f"e2e {engine.name}: kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def assert_container_serves(boot: Boot, plan: dict[str, Any], engine: Engine) -> None:
    """The container's processes carry the plan's CPUs and nodes, bound; the HF cache mount
    is what it reads; it answers a chat."""
    processes = [p for p in boot.one("container")["processes"] if not p.get("gone")]
    assert any("serve" in " ".join(p["cmdline"]) for p in processes), processes
    cpus, nodes = set(parse_cpulist(plan["cpus"])), set(plan["numa_nodes"])
    bind = "bind:" + ",".join(map(str, plan["numa_nodes"]))
    for proc in processes:
        for cpu_list in proc["threads_cpus"]:
            assert set(parse_cpulist(cpu_list)) <= cpus, proc
        assert set(parse_cpulist(proc["Mems_allowed_list"])) == nodes, proc
        assert set(parse_cpulist(proc["cgroup"]["cpuset:cpuset.cpus"])) == cpus, proc
        assert set(parse_cpulist(proc["cgroup"]["cpuset:cpuset.mems"])) == nodes, proc
        assert engine.cgroup_marker in proc["cgroup"]["cpuset:path"], proc
    assert set(parse_cpulist(processes[0]["Cpus_allowed_list"])) == cpus, processes[0]
    # cpuset.mems confines every process; vLLM's worker, which holds the weights and the KV
    # cache, binds its memory itself (VLLM_CPU_OMP_THREADS_BIND), with the SYS_NICE the unit adds
    workers = [p for p in processes if p["cmdline"][:1] == ["VLLM::Worker"]]
    assert workers and all(bind in p["numa_policies"] for p in workers), processes
    log = unit_log(boot, 400)
    assert "Operation not permitted" not in log, log
    mounts = boot.one("container_mounts")["mounts"]
    hf = [m for m in mounts if m.get("Destination") == "/root/.cache/huggingface"]
    assert hf and hf[0]["Source"] == "/root/.cache/huggingface", mounts
    assert "models--epyc-llm-test--tiny" in boot.one("container_hub")["stdout"]
    chat = boot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] >= 1 and chat["reply"]["model"] == NAME, chat


@pytest.fixture(scope="module")
def install(engine_machine: EngineMachine) -> Boot:
    return engine_machine.boot("install")


def container_backend(machine: Serving) -> str:
    """The backend the plan must give: for the test image, an image the product does not
    know, the zentorch path where the serving root shows AVX-512 BF16, else the stock path
    (zentorch in it cannot run); unvalidated either way (consent). On the stock route the
    stock image, consent for a CPU without AVX-512 BF16."""
    return "zentorch" if machine.bf16 else "stock"


@pytest.fixture(scope="module")
def plan(install: Boot, engine: Engine, engine_machine: EngineMachine) -> dict[str, Any]:
    done = install.one("plan")
    assert done["rc"] == 0, done["stderr"]
    planned: dict[str, Any] = json.loads(done["stdout"])
    assert (planned["runtime"], planned["image"]) == (engine.name, engine.image), planned
    backend = json.loads((engine_machine.results / "config.json").read_text())["backend"]
    assert (planned["backend"], planned["requires_confirmation"]) == (backend, True), planned
    if backend == "stock" and engine.route == "native":  # its own image, where zentorch is off
        assert any("not one the product knows" in r for r in planned["confirmation_reasons"])
    return planned


def test_approve_waits_for_health_then_serves(
    install: Boot, plan: dict[str, Any], engine: Engine
) -> None:
    install.assert_clean()
    assert install.one("pid1")["comm"] == "systemd"
    version = install.one("engine_version")
    assert version["stdout"].startswith(engine.version), version
    approve = install.one("approve")
    assert approve["rc"] == 0, approve["stdout"][-2000:] + approve["stderr"][-3000:]
    unit = install.one("unit")
    generated = f"/run/systemd/generator/{UNIT}"
    assert unit["FragmentPath"] == (generated if engine.name == "podman" else engine.unit_file)
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit_log(install)
    # READY=1: podman's own after the health check (Notify=healthy), else the supervisor's
    assert (unit["Type"], unit["NotifyAccess"]) == ("notify", engine.notify_access), unit
    samples = install.one("approve_timeline")["samples"]
    loaded = [s for s in samples if s[UNIT]["LoadState"] == "loaded"]
    activating = [s for s in loaded if s[UNIT]["ActiveState"] == "activating"]
    assert activating and any(s["health"] != 200 for s in activating), loaded
    assert loaded[-1][UNIT]["ActiveState"] == "active", loaded[-1]
    assert_container_serves(install, plan, engine)
    assert install.one("files")["unit_sha"], f"no {engine.unit_file}"
    tiny = endpoint(install.one("status")["status"], NAME)
    assert (tiny["state"], tiny["url"]) == ("ready", URL), tiny


def test_reboot_serves_without_a_new_approval_and_stop_holds(
    engine_machine: EngineMachine, install: Boot, plan: dict[str, Any], engine: Engine
) -> None:
    boot = engine_machine.boot("reboot")
    boot.assert_clean()
    assert boot.one("unit")["ActiveState"] == "active", unit_log(boot)
    assert_container_serves(boot, plan, engine)
    assert endpoint(boot.one("status")["status"], NAME)["state"] == "ready"
    before, after = install.one("files"), boot.one("files")
    assert (after["unit_sha"], after["approval_sha"]) == (
        before["unit_sha"],
        before["approval_sha"],
    )
    assert boot.one("stop")["rc"] == 0, boot.one("stop")["stderr"]
    assert boot.one("unit_after_stop")["ActiveState"] == "inactive", boot.one("unit_after_stop")
    assert f"epyc-llm-{NAME}" not in boot.one("containers_after_stop")["names"]

    stopped = engine_machine.boot("stopped-reboot")
    stopped.assert_clean()
    assert stopped.one("unit")["ActiveState"] == "inactive", stopped.one("unit")
    assert f"epyc-llm-{NAME}" not in stopped.one("containers")["names"]
    assert endpoint(stopped.one("status")["status"], NAME)["state"] == "stopped"


def threads_per_core() -> int:
    siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text()
    return len(parse_cpulist(siblings.strip()))


@pytest.fixture(scope="module")
def kube_player(engine: Engine) -> Engine:
    """Set up before the machine (same scope, asked for first): docker's is never booted
    for a test it would skip."""
    if engine.name != "podman":
        pytest.skip("`podman kube play` is podman's: docker has no Kubernetes player")
    return engine


def test_the_kube_export_serves_under_podman_kube_play(
    kube_player: Engine, engine_machine: EngineMachine, plan: dict[str, Any]
) -> None:
    """The Deployment `epycctl export kube` writes from the approved plan, played by podman's
    own Kubernetes player: Guaranteed requests from the plan, enforced by the container's
    cgroups, and it serves the model."""
    exported = engine_machine.boot("reboot").one("kube_export")
    assert exported["rc"] == 0, exported["stderr"]
    objects = json.loads(exported["stdout"])["objects"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == kube_player.image, container
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert requests == limits, container["resources"]
    cpus = int(limits["cpu"])
    assert cpus == len(parse_cpulist(plan["cpus"])) * threads_per_core(), (limits, plan["cpus"])
    memory = int(limits["memory"].removesuffix("Gi")) * 2**30

    boot = engine_machine.boot("stopped-reboot")
    play = boot.one("kube_play")
    assert play["rc"] == 0, play["stderr"][-3000:]
    assert boot.one("kube_ready")["ready"], boot.one("kube_ready")
    played = boot.one("kube_container")
    processes = [p for p in played["processes"] if not p.get("gone")]
    assert any("serve" in " ".join(p["cmdline"]) for p in processes), played
    cgroup = played["cgroup"]
    assert int(cgroup["cpu.cfs_quota_us"]) == cpus * int(cgroup["cpu.cfs_period_us"]), played
    assert int(cgroup["memory.limit_in_bytes"]) == memory, played
    chat = boot.one("kube_chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] >= 1 and chat["reply"]["model"] == NAME, chat
    assert boot.one("kube_down")["rc"] == 0, boot.one("kube_down")["stderr"]
    assert played["name"] not in boot.one("containers_after_kube_down")["names"]


def test_an_absent_image_fails_clearly_without_a_restart_loop(
    engine_machine: EngineMachine,
) -> None:
    """The start fails with the image named; since the healing policy the unit restarts on
    failure, and after CRASH_LOOP_RUNS failed runs the crash loop keeps it down: the runs stop."""
    boot = engine_machine.boot("stopped-reboot")
    approve = boot.one("absent_approve")
    assert approve["rc"] != 0, approve
    first, later = boot.one("absent_unit"), boot.one("absent_unit_later")
    assert first["ActiveState"] in {"failed", "inactive"}, first
    settled = (later["ActiveState"], later["NRestarts"])
    assert settled == (first["ActiveState"], first["NRestarts"]), (first, later)
    assert int(later["NRestarts"]) <= CRASH_LOOP_RUNS, f"{later['NRestarts']} restarts"
    status = endpoint(boot.one("absent_status")["status"], ABSENT)
    assert status["state"] == "crash-loop", status
    messages = " ".join(str(e["message"]) for e in boot.one("absent_journal")["entries"])
    assert "absent" in messages and "image" in messages.lower(), messages[-2000:]
    assert "Unable to find image" not in messages, "docker run tried to pull at start"


def test_remove_removes_the_container(engine_machine: EngineMachine, engine: Engine) -> None:
    boot = engine_machine.boot("stopped-reboot")
    assert boot.one("start")["rc"] == 0, boot.one("start")["stderr"]
    assert f"epyc-llm-{NAME}" in boot.one("containers_after_start")["names"]
    assert boot.one("remove")["rc"] == 0, boot.one("remove")["stderr"]
    assert boot.one("unit_after_remove")["LoadState"] == "not-found", boot.one("unit_after_remove")
    assert f"epyc-llm-{NAME}" not in boot.one("containers_after_remove")["names"]
    assert boot.one("unit_file_after_remove")["exists"] is False, engine.unit_file
