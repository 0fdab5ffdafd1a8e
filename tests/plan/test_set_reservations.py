"""An approved set of either engine holds all it was given: every NUMA node, core and
instance port of its members. A new endpoint file is refused, or placed on what is left; it
never lands on the set (a host-wide llama.cpp set once held only its balancer port, and a new
endpoint was planned onto its CPUs, nodes and first instance port)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import Plan
from epycd.plan.placement.reservations import Reservations
from tests.engines.endpoints import ENGINES, engine_lines
from tests.plan.conftest import PlanWorkspace

HostOf = Callable[..., HostFacts]


def held_by(plan: Plan) -> tuple[set[int], set[int], set[int]]:
    """The CPUs, NUMA nodes and ports of a plan's servers, and its own port."""
    servers = plan.decisions.servers
    cpus = {c for s in servers for c in parse_cpulist(s.cpus)}
    nodes = {n for s in servers for n in s.numa_nodes}
    ports = {s.port for s in servers} | {plan.decisions.port}
    return cpus, nodes, ports


@pytest.mark.parametrize("set_engine", ENGINES)
@pytest.mark.parametrize("new_engine", ENGINES)
@pytest.mark.parametrize("instances", ["2", '"auto"'])
def test_a_new_file_never_lands_on_an_approved_set(
    ws: PlanWorkspace, host_of: HostOf, set_engine: str, new_engine: str, instances: str
) -> None:
    host = host_of("genoa-9654-2s-nps4")
    spread = f'instances = {instances}\nplacement = "host"\n'
    ws.endpoint("big", engine_lines(ws.tmp, set_engine) + spread)
    first = ws.plan(host)["big"]
    assert first.plan is not None, [e.text for e in first.errors]
    assert first.plan.decisions.instances is not None
    approved = Reservations.of({"big": first.plan})
    set_cpus, set_nodes, set_ports = held_by(first.plan)

    ws.endpoint("new", engine_lines(ws.tmp, new_engine))
    results = ws.plan(host, reservations=approved)
    again = results["big"].plan
    assert again is not None and held_by(again) == (set_cpus, set_nodes, set_ports)
    new = results["new"]
    if new.plan is None:
        assert new.errors, "neither a plan nor an error"
        return
    cpus, nodes, ports = held_by(new.plan)
    assert not cpus & set_cpus, (sorted(cpus & set_cpus), set_engine, new_engine)
    assert not nodes & set_nodes, (sorted(nodes & set_nodes), set_engine, new_engine)
    assert not ports & set_ports, (sorted(ports & set_ports), set_engine, new_engine)
