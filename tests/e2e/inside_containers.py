"""The admin's side of the container end-to-end test (tests/e2e/test_containers.py), run
inside the booted machine by the same oneshot driver unit as tests/e2e/inside.py, whose
helpers it reuses (copied beside it into /opt/e2e). One phase per boot:

install         install.sh; an endpoint with the configured runtime and the local image;
                approve --no-pull; the units, the container's processes and cgroup, the HF
                cache mount, a chat, status
reboot          back with no new approval; `epycctl export kube` of the approved plan
                (podman); then `epycctl stop`
stopped-reboot  not started at boot; `epycctl remove`; the exported Deployment under
                `podman kube play` (podman): its cgroup limits, /health, a chat; an absent
                image with --no-pull
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import inside
from inside import (
    CONFIG,
    NAME,
    UNIT,
    PhaseFailed,
    Timeline,
    chat,
    epycctl_status,
    journal,
    must,
    process_facts,
    record,
    run,
    serving_evidence,
    show,
    use_identity_root,
    wait_for_daemon,
    wait_for_unit_to_settle,
    wait_until,
)

inside.ENV["HF_HUB_OFFLINE"] = "1"
ENGINE: str = CONFIG["engine"]
CONTAINER = f"epyc-llm-{NAME}"
ABSENT: str = CONFIG["absent"]
ABSENT_UNIT = f"epyc-llm-{ABSENT}.service"
KUBE_EXPORT = Path("/var/lib/e2e-kube-export.json")
"""The reboot boot's `epycctl export kube --json` (kept on the machine's disk for the next)."""
KUBE_FILE = Path("/var/lib/e2e-kube-deployment.json")
KUBE_VOLUME = "tiny-hf-cache"
"""The --model-volume claim: under `podman kube play` a podman volume of that name, bound to
the machine's HF cache as a PersistentVolumeClaim would hold it in a cluster."""
HF_CACHE = "/root/.cache/huggingface"
KUBE_READY_S = 600


def container_pids() -> list[int]:
    """The container's processes: its init as the engine reports it, and all below it."""
    done = run(ENGINE, "inspect", "--format", "{{.State.Pid}}", CONTAINER)
    pid = int(done["stdout"].strip() or 0) if done["rc"] == 0 else 0
    return [pid, *inside.descendants(pid)] if pid else []


def cgroup_cpuset(pid: int) -> dict[str, str]:
    """The cpuset the process's cgroup grants (v1 cpuset hierarchy, else the v2 one)."""
    found: dict[str, str] = {}
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers in ("cpuset", ""):
            base = Path("/sys/fs/cgroup") / ("cpuset" if controllers else "") / path.lstrip("/")
            for name in ("cpuset.cpus", "cpuset.mems", "cpuset.cpus.effective"):
                if (base / name).is_file():
                    found[f"{controllers or 'v2'}:{name}"] = (base / name).read_text().strip()
            found[f"{controllers or 'v2'}:path"] = path
    return found


def record_container(check: str) -> None:
    pids = container_pids()
    processes = [process_facts(pid) | {"cgroup": cgroup_cpuset(pid)} for pid in pids]
    record(check, processes=processes)
    inspect = run(ENGINE, "inspect", CONTAINER)
    mounts = json.loads(inspect["stdout"])[0].get("Mounts", []) if inspect["rc"] == 0 else []
    record(f"{check}_mounts", mounts=mounts)
    listing = run(ENGINE, "exec", CONTAINER, "ls", "/root/.cache/huggingface/hub")
    record(f"{check}_hub", rc=listing["rc"], stdout=listing["stdout"], stderr=listing["stderr"])


UNIT_FILE = Path(CONFIG["unit_file"])


def unit_files(check: str) -> None:
    """The file approve wrote (for podman the Quadlet file; its generator makes the unit)."""
    record(check, unit_sha=inside.sha256(UNIT_FILE), approval_sha=inside.sha256(inside.APPROVAL))


def engine_containers(check: str) -> None:
    done = run(ENGINE, "ps", "-a", "--format", "{{.Names}}", check=None)
    record(check, rc=done["rc"], names=done["stdout"].split(), stderr=done["stderr"][-2000:])


def approve(name: str, check: str) -> dict[str, Any]:
    done: dict[str, Any] = run(
        "epycctl", "approve", name, "--yes", "--no-pull", "--accept-unvalidated",
        *CONFIG["consent_args"], timeout=900, check=check,
    )  # fmt: skip
    return done


def export_kube() -> None:
    done = run(
        "epycctl", "export", "kube", NAME, "--json", "--model-volume", KUBE_VOLUME,
        timeout=120, check="kube_export",
    )  # fmt: skip
    if done["rc"] == 0:
        KUBE_EXPORT.write_text(done["stdout"])


def kube_container() -> str | None:
    """The Deployment's vLLM container under `podman kube play` (named POD-CONTAINER)."""
    done = run("podman", "ps", "--format", "{{.Names}}")
    names = [n for n in done["stdout"].split() if n.endswith("-vllm")]
    return names[0] if names else None


def cgroup_folder(controller: str, path: str) -> Path | None:
    """The v1 cgroup folder of a /proc/PID/cgroup path. That path is relative to the
    machine's cgroup namespace while the mounted hierarchy is the host's, so where the host
    put this machine below its root (the memory hierarchy of a sandboxed host) the path
    reads `/../../libpod_parent/...`: the folder is found by its own name (libpod-ID)."""
    root = Path("/sys/fs/cgroup") / controller
    direct = root / path.lstrip("/")
    if ".." not in Path(path).parts and direct.is_dir():
        return direct
    name = Path(path).name
    for folder, _, _ in os.walk(root):
        if Path(folder).name == name:
            return Path(folder)
    return None


def cgroup_limits(pid: int) -> dict[str, str]:
    """The CPU quota and memory limit the container's v1 cgroups enforce."""
    found: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.limit_in_bytes"):
            if name.split(".")[0] not in controllers.split(","):
                continue
            folder = cgroup_folder(controllers, path)
            if folder is not None and (folder / name).is_file():
                found[name] = (folder / name).read_text().strip()
    return found


def kube_play() -> None:
    """The exported Deployment, as a cluster would get it, under podman's own Kubernetes
    player: one change, hostNetwork (this nspawn machine has no CAP_NET_ADMIN for a pod
    network); the model's claim is a podman volume bound to the HF cache."""
    if not KUBE_EXPORT.is_file():
        record("kube_play", rc=None, stderr=f"no {KUBE_EXPORT}: the export failed")
        return
    objects = json.loads(KUBE_EXPORT.read_text())["objects"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["hostNetwork"] = True
    KUBE_FILE.write_text(json.dumps(deployment, indent=1))
    run(
        "podman", "volume", "create", "--opt", "type=none", "--opt", "o=bind",
        "--opt", f"device={HF_CACHE}", KUBE_VOLUME, check="kube_volume",
    )  # fmt: skip
    play = run("podman", "kube", "play", str(KUBE_FILE), timeout=600, check="kube_play")
    if play["rc"] != 0:
        return
    started = time.monotonic()
    ready = wait_until(
        "the pod's /health", lambda: inside.health(CONFIG["port"]) == 200, KUBE_READY_S, 2
    )
    record("kube_ready", ready=ready, seconds=round(time.monotonic() - started, 1))
    name = kube_container()
    inspect = run("podman", "inspect", name or "none")
    facts = json.loads(inspect["stdout"])[0] if inspect["rc"] == 0 else {}
    host_config, pid = facts.get("HostConfig", {}), facts.get("State", {}).get("Pid", 0)
    record(
        "kube_container",
        name=name,
        host_config={
            k: host_config.get(k)
            for k in ("NanoCpus", "CpuQuota", "CpuPeriod", "Memory", "CapAdd", "Ulimits")
        },
        cgroup=cgroup_limits(pid) if pid else {},
        processes=[process_facts(p) for p in ([pid, *inside.descendants(pid)] if pid else [])],
    )
    chat("kube_chat")
    run("podman", "kube", "down", str(KUBE_FILE), timeout=300, check="kube_down")
    engine_containers("containers_after_kube_down")


def phase_install() -> None:
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    run(ENGINE, "--version", check="engine_version")
    if ENGINE == "docker":
        wait_until("docker is up", lambda: show("docker.service")["ActiveState"] == "active", 120)
        must("load", "docker", "load", "-i", "/opt/image/image.tar", timeout=900)
    run(ENGINE, "images", check="images")
    must("install", "/src/packaging/install.sh", timeout=900)
    use_identity_root()
    inside.ENDPOINT_FILE.write_text(CONFIG["endpoint_toml"])
    must("plan", "epycctl", "plan", NAME, "--json", timeout=300)
    with Timeline("approve_timeline", (UNIT,), every=0.5):
        approved = approve(NAME, "approve")
    serving_evidence()
    if approved["rc"] != 0:
        raise PhaseFailed(f"approve failed (exit {approved['rc']}): {approved['stderr'][-2000:]}")
    record("unit", **show(UNIT, "ActiveState", "SubState", "Type", "NotifyAccess", "MainPID",
                          "NRestarts", "StatusText", "FragmentPath"))  # fmt: skip
    record_container("container")
    chat("chat")
    epycctl_status("status", NAME)
    unit_files("files")


def phase_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_until("the endpoint is active", lambda: show(UNIT)["ActiveState"] == "active", 600)
    record("unit", **show(UNIT, "ActiveState", "SubState", "MainPID", "NRestarts"))
    serving_evidence()
    record_container("container")
    chat("chat")
    epycctl_status("status", NAME)
    unit_files("files")
    if ENGINE == "podman":
        export_kube()
    run("epycctl", "stop", NAME, timeout=300, check="stop")
    record("unit_after_stop", **show(UNIT, "ActiveState", "SubState", "UnitFileState"))
    engine_containers("containers_after_stop")


def phase_stopped_reboot() -> None:
    wait_for_daemon("boot_timeline")
    # the refused start's ExecStopPost= (the crash recorder, podman rm) may still be running
    wait_for_unit_to_settle(120)
    record("unit", **show(UNIT, "ActiveState", "SubState", "UnitFileState"))
    engine_containers("containers")
    epycctl_status("status", NAME)

    run("epycctl", "start", NAME, timeout=900, check="start")
    engine_containers("containers_after_start")
    run("epycctl", "remove", NAME, "--yes", timeout=300, check="remove")
    record("unit_after_remove", **show(UNIT, "LoadState", "ActiveState"))
    engine_containers("containers_after_remove")
    record("unit_file_after_remove", exists=UNIT_FILE.exists())
    if ENGINE == "podman":
        kube_play()

    (inside.ENDPOINT_FILE.parent / f"{ABSENT}.toml").write_text(CONFIG["absent_toml"])
    approve(ABSENT, "absent_approve")
    inside.wait_until(
        "absent crash-loop",
        lambda: inside.endpoint_state(ABSENT) == "crash-loop",
        CONFIG["restart_watch_s"],
        2,
    )
    time.sleep(10)  # the restart scheduled after the third run (RestartSec=5s) is refused
    record("absent_unit", **show(ABSENT_UNIT, "ActiveState", "SubState", "Result", "NRestarts"))
    time.sleep(inside.CRASH_LOOP_QUIET_S)
    record("absent_unit_later", **show(ABSENT_UNIT, "ActiveState", "SubState", "NRestarts"))
    epycctl_status("absent_status", ABSENT)
    journal("absent_journal", ABSENT_UNIT)


PHASES = {"install": phase_install, "reboot": phase_reboot, "stopped-reboot": phase_stopped_reboot}

if __name__ == "__main__":
    inside.PHASES = PHASES
    inside.main()
