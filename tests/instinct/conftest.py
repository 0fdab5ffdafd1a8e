"""Planning Instinct endpoints on fake hosts, with the test models in an offline HF cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epycd.host.detect import detect_host
from epycd.host.facts import DockerFacts, HostFacts, RuntimeFacts
from tests.hosts import HostShape, write_host
from tests.model.hf_cache import add_to_cache
from tests.model.models import model_files
from tests.plan.conftest import PODMAN_5, PlanWorkspace
from tests.plan.conftest import host_of as host_of
from tests.secrets import root_folder

DOCKER = RuntimeFacts(docker=DockerFacts(present=True, version="28.2.2", daemon_reachable=True))


@pytest.fixture
def ws(monkeypatch: pytest.MonkeyPatch) -> Iterator[PlanWorkspace]:
    """A workspace in a folder only root controls: its HF token file is accepted there."""
    with root_folder() as folder:
        yield workspace_in(folder, monkeypatch)


def workspace_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PlanWorkspace:
    workspace = PlanWorkspace(tmp_path)
    for repo_id, files in model_files().items():
        add_to_cache(workspace.hf_home / "hub", repo_id, files)
    monkeypatch.setenv("HF_HOME", str(workspace.hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    token = tmp_path / "secrets" / "hf.token"
    token.parent.mkdir()
    token.write_text("hf_test00000000000000000000000000000\n")
    token.chmod(0o600)
    return workspace


@pytest.fixture
def shape_host(tmp_path: Path) -> Callable[[HostShape], HostFacts]:
    def make(shape: HostShape) -> HostFacts:
        root = write_host(tmp_path / "shaped", shape)
        host = detect_host(root, probe_runtimes=False)
        return host.model_copy(update={"runtimes": RuntimeFacts(podman=PODMAN_5)})

    return make
