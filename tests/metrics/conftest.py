from __future__ import annotations

import sys
from pathlib import Path

import pytest

from epycd.host.facts import DockerFacts, RuntimeFacts
from epycd.plan.endpoint import Plan
from tests.plan.conftest import PlanWorkspace, fake_host
from tests.render.fixtures import as_plan, host_vllm, with_decisions
from tests.render.realtools import test_cache as cache_root

DOCKER = RuntimeFacts(docker=DockerFacts(present=True, version="28.2.2", daemon_reachable=True))


@pytest.fixture
def docker_set(tmp_path: Path) -> Plan:
    """A set of instances planned by the real planner on the fake dual-socket Milan host."""
    ws = PlanWorkspace(tmp_path)
    ws.endpoint("multi", 'instances = "auto"\nplacement = "host"\nport = 8100\n')
    host = fake_host(tmp_path, "milan-7763-2s", DOCKER)
    result = ws.plan(host, product_python=sys.executable)["multi"]
    assert result.plan is not None, [e.text for e in result.errors]
    assert result.plan.instance_set is not None
    return result.plan


def single(name: str, port: int) -> Plan:
    """An approved single CPU endpoint whose vLLM listens on 127.0.0.1:`port`."""
    return with_decisions(as_plan(host_vllm()), endpoint=name, port=port, host="127.0.0.1")


def promtool() -> Path:
    binary = cache_root() / "prometheus" / "root" / "usr" / "bin" / "promtool"
    if not binary.is_file():
        pytest.fail(f"Debian's promtool is missing ({binary}): run tests/bootstrap.sh")
    return binary
