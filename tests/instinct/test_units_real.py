"""Instinct plans from the fake hosts pass the real tools: the docker `.service` passes
`systemd-analyze verify`; the `.container`s pass Quadlet 5.4's generator (AddDevice=,
GroupAdd=, SeccompProfile= are its keys) and its output passes verify too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.host.facts import HostFacts
from tests.instinct.conftest import DOCKER
from tests.plan.conftest import PlanWorkspace
from tests.render.realtools import quadlet_dryrun, verify, write_units

HostOf = Callable[..., HostFacts]
GPU = 'device = "instinct"\nmodel = "Qwen/Qwen3-0.6B"\n'


def units_of(ws: PlanWorkspace, host: HostFacts) -> dict[str, str]:
    units: dict[str, str] = {}
    for result in ws.plan(host).values():
        assert result.plan is not None, [p.text for p in result.errors]
        units.update(result.plan.units)
    return units


def test_docker_gpu_service_verifies(ws: PlanWorkspace, host_of: HostOf, tmp_path: Path) -> None:
    ws.endpoint("a", GPU + "gpus = [4, 5, 6, 7]\n")
    ws.endpoint("b", GPU)
    units = units_of(ws, host_of("turin-2s-8x-mi355x", DOCKER))
    assert sorted(units) == ["epyc-llm-a.service", "epyc-llm-b.service"]
    verify(write_units(tmp_path / "units", units))


@pytest.mark.quadlet
def test_podman_gpu_containers_pass_quadlet_and_verify(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    ws.endpoint("gpu", GPU + "gpus = [1]\n")
    ws.endpoint("cpu", 'model = "Qwen/Qwen3-0.6B"\n')
    units = units_of(ws, host_of("genoa-2s-8x-mi300x"))
    write_units(tmp_path / "quadlet", units)
    generated = quadlet_dryrun(tmp_path / "quadlet")
    assert sorted(generated) == ["epyc-llm-cpu.service", "epyc-llm-gpu.service"]
    run = next(line for line in generated["epyc-llm-gpu.service"].splitlines()
               if line.startswith("ExecStart="))  # fmt: skip
    for flag in ("--device /dev/kfd", "--device /dev/dri", "--group-add video",
                 "--group-add render", "--cap-add sys_ptrace",
                 "--security-opt seccomp=unconfined", "HIP_VISIBLE_DEVICES=1"):  # fmt: skip
        assert flag in run, (flag, run)
    verify(write_units(tmp_path / "generated", generated))
