"""Container runtimes: parsing, and the real podman/docker of this machine when present."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from epycd.host import runtimes
from epycd.host.detect import detect_host
from tests.hosts import make_host


@pytest.mark.parametrize(
    ("version", "quadlet", "healthy"),
    [("4.3.1", False, False), ("4.4.0", True, False), ("4.9.3", True, False),
     ("5.0.0", True, True), ("5.4.2-dev", True, True), (None, False, False)],
)  # fmt: skip
def test_podman_feature_gates(version: str | None, quadlet: bool, healthy: bool) -> None:
    facts = runtimes.podman_facts(version, rootful=True)
    assert (facts.quadlet, facts.notify_healthy) == (quadlet, healthy)


def test_docker_facts_from_version_json() -> None:
    up = {"Client": {"Version": "28.2.2"}, "Server": {"Version": "28.2.2"}}
    down = {"Client": {"Version": "28.2.2"}, "Server": None}
    assert runtimes.docker_facts(json.dumps(up)).daemon_reachable is True
    assert runtimes.docker_facts(json.dumps(down)).model_dump() == {
        "present": True,
        "version": "28.2.2",
        "daemon_reachable": False,
    }
    assert runtimes.docker_facts("not json").version is None


def test_absent_runtimes_are_facts_not_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    facts = runtimes.probe_runtimes(None)
    assert facts.podman.present is False and facts.docker.present is False


def test_hanging_docker_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\nexec sleep 30\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(runtimes, "PROBE_TIMEOUT_S", 0.5)
    facts = runtimes.probe_docker()
    assert facts.present is True and facts.daemon_reachable is False


def test_real_podman_when_installed() -> None:
    podman = shutil.which("podman")
    facts = runtimes.probe_podman()
    assert facts.present == (podman is not None)
    if podman:
        out = subprocess.run(["podman", "version", "--format", "json"], capture_output=True)
        client = json.loads(out.stdout)["Client"]["Version"]
        assert facts.version == client
        assert facts.rootful == (os.geteuid() == 0)


def test_real_docker_when_installed() -> None:
    docker = shutil.which("docker")
    facts = runtimes.probe_docker()
    assert facts.present == (docker is not None)
    if docker:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=10)
        assert facts.daemon_reachable == (info.returncode == 0)


def test_vllm_path_is_probed_even_on_a_fake_root(tmp_path: Path) -> None:
    root = make_host(tmp_path, "vm-zen5")
    facts = detect_host(root, probe_runtimes=False, vllm=str(tmp_path / "no-such-vllm"))
    assert facts.runtimes.vllm is not None
    assert facts.runtimes.vllm.present is False
    assert facts.runtimes.podman.present is False
