"""The boot-time approval check (`python -m epycd.approval.check NAME`) for an Instinct
endpoint: a GPU of its plan gone or changed refuses the start; a CPU endpoint on the same
host does not care about GPUs."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.plans import make_plan, on_gpus
from tests.hosts import CATALOGUE, FakeGpu, write_host

GPU_HOST = CATALOGUE["genoa-2s-8x-mi300x"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ApprovalSandbox:
    sandbox = make_env(tmp_path, monkeypatch)
    root = str(write_host(tmp_path / "gpu-host", GPU_HOST))
    sandbox.vars["EPYCD_HOST_ROOT"] = root
    monkeypatch.setenv("EPYCD_HOST_ROOT", root)
    return sandbox


def approve(env: ApprovalSandbox, gpus: list[int]) -> None:
    plans = [on_gpus(make_plan("gpu", env.host(), env.settings.config_dir, socket=0), gpus)]
    plans.append(make_plan("cpu", env.host(), env.settings.config_dir, socket=1, port=8001))
    env.set_plans(*plans)
    for name in ("gpu", "cpu"):
        done = env.epycctl("approve", name, "--yes", "--no-start")
        assert done.returncode == 0, done.stderr


def check(env: ApprovalSandbox, name: str, root: Path) -> subprocess.CompletedProcess[str]:
    return env.epycctl(name, module="epycd.approval.check", EPYCD_HOST_ROOT=str(root))


def test_a_changed_gpu_refuses_the_gpu_endpoint_only(env: ApprovalSandbox) -> None:
    approve(env, [2])
    assert check(env, "gpu", env.host_root).returncode == 0
    gpus = list(GPU_HOST.gpus)
    gpus[2] = FakeGpu(90500, 288, 2)
    other = write_host(env.tmp / "other-gfx", replace(GPU_HOST, gpus=tuple(gpus)))
    done = check(env, "gpu", other)
    assert done.returncode == 1, done.stderr
    assert "GPU 2 gfx942 192 GiB node 2 0000:25:00.0 -> gfx950 288 GiB" in done.stderr
    assert check(env, "cpu", other).returncode == 0


def test_a_gpu_gone_refuses_the_start(env: ApprovalSandbox) -> None:
    approve(env, [6, 7])
    fewer = write_host(env.tmp / "fewer", replace(GPU_HOST, gpus=GPU_HOST.gpus[:7]))
    done = check(env, "gpu", fewer)
    assert done.returncode == 1
    assert "GPU 7 gfx942 192 GiB node 7 0000:75:00.0 -> gone" in done.stderr
