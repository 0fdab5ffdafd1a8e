"""Container runtimes and a host vLLM on the machine this process runs on.

Every probe is bounded by a timeout and turns any failure into "absent" or "unreachable",
never an exception: detection must work on hosts without podman or docker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from epycd.childproc import run_bounded
from epycd.host.facts import DockerFacts, HostVllmFacts, PodmanFacts, RuntimeFacts

PROBE_TIMEOUT_S = 3.0
QUADLET_SINCE = (4, 4)
NOTIFY_HEALTHY_SINCE = (5, 0)
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def version_tuple(version: str) -> tuple[int, int, int] | None:
    match = _VERSION.search(version)
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    try:
        return run_bounded(argv, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None


def podman_facts(version: str | None, *, rootful: bool) -> PodmanFacts:
    parsed = version_tuple(version) if version else None
    return PodmanFacts(
        present=True,
        version=version,
        rootful=rootful,
        quadlet=parsed is not None and parsed[:2] >= QUADLET_SINCE,
        notify_healthy=parsed is not None and parsed[:2] >= NOTIFY_HEALTHY_SINCE,
    )


def probe_podman() -> PodmanFacts:
    """`podman --version` (fast; `podman version` starts the whole engine). Rootful means
    this process runs as root, as the product's system units do."""
    executable = shutil.which("podman")
    if executable is None:
        return PodmanFacts(present=False)
    result = _run([executable, "--version"])
    version = None
    if result is not None and result.returncode == 0:
        parsed = version_tuple(result.stdout)
        version = ".".join(map(str, parsed)) if parsed else None
    return podman_facts(version, rootful=os.geteuid() == 0)


def docker_facts(version_json: str | None) -> DockerFacts:
    """From `docker version --format '{{json .}}'`: Server is null when no daemon answers."""
    try:
        data = json.loads(version_json) if version_json else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return DockerFacts(present=True)
    client = data.get("Client") or {}
    server = data.get("Server") or {}
    return DockerFacts(
        present=True,
        version=client.get("Version") if isinstance(client, dict) else None,
        daemon_reachable=isinstance(server, dict) and bool(server.get("Version")),
    )


def probe_docker() -> DockerFacts:
    executable = shutil.which("docker")
    if executable is None:
        return DockerFacts(present=False)
    result = _run([executable, "version", "--format", "{{json .}}"])
    if result is None:
        return DockerFacts(present=True)
    return docker_facts(result.stdout.strip().splitlines()[0] if result.stdout.strip() else None)


def probe_host_vllm(path: str) -> HostVllmFacts:
    """Delegates to `vllm_probe`, which runs the vLLM's own interpreter."""
    try:
        from epycd.host.vllm_probe import probe_vllm
    except ImportError as exc:
        return HostVllmFacts(path=path, present=Path(path).exists(), error=f"no probe: {exc}")
    return probe_vllm(path)


def probe_runtimes(vllm: str | None = None) -> RuntimeFacts:
    return RuntimeFacts(
        podman=probe_podman(),
        docker=probe_docker(),
        vllm=probe_host_vllm(vllm) if vllm else None,
    )


def embedded_vllm(runtime_dir: Path) -> str | None:
    """The embedded runtime's `vllm`, where `packaging/install.sh --runtime` provisioned it."""
    vllm = runtime_dir / "bin" / "vllm"
    return str(vllm) if os.access(vllm, os.X_OK) else None


def only_vllm(vllm: str | None) -> RuntimeFacts:
    return RuntimeFacts(vllm=probe_host_vllm(vllm) if vllm else None)
