"""Plans from the fake hosts render units the real tools accept: every `.service` passes
`systemd-analyze verify` (exit 0, empty stderr); every `.container` passes Quadlet 5.4's
generator, whose output passes verify too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.host.facts import DockerFacts, HostFacts, HostVllmFacts, RuntimeFacts
from epycd.plan.endpoint import Plan
from tests.plan.conftest import PlanWorkspace
from tests.render.realtools import quadlet_dryrun, verify, write_units

HostOf = Callable[..., HostFacts]
DOCKER = RuntimeFacts(docker=DockerFacts(present=True, version="28.2.2", daemon_reachable=True))


def zen(executable: str) -> HostVllmFacts:
    return HostVllmFacts(path=executable, present=True, version="0.25.1", platform="ZenCpuPlatform")


def all_plans(ws: PlanWorkspace, host: HostFacts, **kwargs: object) -> list[Plan]:
    plans = []
    for result in ws.plan(host, **kwargs).values():
        assert result.plan is not None, [p.text for p in result.errors]
        plans.append(result.plan)
    return plans


def test_host_and_docker_services_verify(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    ws.endpoint("host-a", 'runtime = "host"\nvllm = "/opt/zen/bin/vllm"\nsocket = 1\n')
    ws.endpoint("host-b", 'runtime = "host"\nvllm = "/opt/zen/bin/vllm"\nthroughput_flags = true\n'
                'restart = "on-failure"\n[env]\nVLLM_LOGGING_LEVEL = "DEBUG"\n')  # fmt: skip
    units = {}
    for plan in all_plans(ws, host_of("genoa-9654-2s-nps4"), probe=zen):
        units.update(plan.units)
    ws.endpoint("host-a", "")
    ws.endpoint("host-b", "socket = 1\n")
    for plan in all_plans(ws, host_of("milan-7763-2s", DOCKER)):
        assert plan.decisions.runtime == "docker"
        units.update({f"docker-{name}": text for name, text in plan.units.items()})
    assert len(units) == 4 and all(name.endswith(".service") for name in units)
    verify(write_units(tmp_path / "units", units))


@pytest.mark.quadlet
def test_podman_containers_pass_quadlet_and_verify(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        ws.endpoint(name, 'extra_args = ["--enforce-eager"]\n' if name == "b" else "")
    units: dict[str, str] = {}
    for plan in all_plans(ws, host_of("genoa-9654-2s-nps4")):
        units.update(plan.units)
    assert sorted(units) == [f"epyc-llm-{n}.container" for n in ("a", "b", "c")]
    folder = tmp_path / "quadlet"
    write_units(folder, units)
    generated = quadlet_dryrun(folder)
    assert sorted(generated) == [f"epyc-llm-{n}.service" for n in ("a", "b", "c")]
    verify(write_units(tmp_path / "generated", generated))
