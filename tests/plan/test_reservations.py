"""`Reservations.of` holds exactly what the four `approved_*` maps of plan/pipeline/current.py held
before it (the old builders are kept here as the reference): each endpoint's sockets (a set's
further NUMA nodes were `NAME_NODE` keys), its set's nodes, its port and instance ports, its
Instinct GPUs."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from epycd.host.facts import HostFacts
from epycd.names import INSTANCE_SEPARATOR
from epycd.plan.endpoint import Plan
from epycd.plan.placement.reservations import Reservations
from tests.approval.plans import on_gpus
from tests.plan.conftest import PlanWorkspace, cpu

HostOf = Callable[..., HostFacts]


def old_approved_sockets(approved: Mapping[str, Plan]) -> dict[str, int]:
    """plan/pipeline/current.py's `approved_sockets` before `Reservations`."""
    held = {name: _socket(plan) for name, plan in approved.items() if not plan.gpus}
    for name, plan in approved.items():
        members = plan.decisions.members
        nodes = sorted({(m.socket, node) for m in members for node in m.numa_nodes})
        for socket, node in nodes[1:]:
            held[f"{name}{INSTANCE_SEPARATOR}{node}"] = socket
    return held


def _socket(plan: Plan) -> int:
    """A CPU plan's socket; a set's was its first member's (which the set is planned from)."""
    if plan.instance_set is not None:
        first: int = plan.decisions.members[0].socket
        return first
    return cpu(plan).socket


def old_maps(approved: Mapping[str, Plan]) -> dict[str, object]:
    return {
        "sockets": old_approved_sockets(approved),
        "gpus": {name: plan.gpus for name, plan in approved.items() if plan.gpus},
        "ports": {name: plan.decisions.port for name, plan in approved.items()},
        "instance_ports": {
            name: [m.port for m in plan.decisions.members]
            for name, plan in approved.items()
            if plan.instance_set is not None
        },
    }


@pytest.fixture
def approved(ws: PlanWorkspace, host_of: HostOf) -> dict[str, Plan]:
    """A single CPU endpoint, a set spanning both sockets' nodes, an Instinct endpoint."""
    ws.endpoint("big", 'instances = "auto"\nplacement = "host"\n')
    ws.endpoint("one", "socket = 0\n")
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    plans = {name: results[name].plan for name in ("big", "one")}
    assert all(plan is not None for plan in plans.values())
    big, one = plans["big"], plans["one"]
    assert big is not None and one is not None and big.instance_set is not None
    return {"big": big, "one": one, "gpu": on_gpus(one, [3, 5])}


@pytest.mark.parametrize(
    "names", [("one",), ("big",), ("gpu",), ("big", "one"), ("big", "one", "gpu")]
)
def test_reservations_hold_what_the_old_maps_held(
    approved: dict[str, Plan], names: tuple[str, ...]
) -> None:
    plans = {name: approved[name] for name in names}
    old = old_maps(plans)
    sockets = old["sockets"]
    ports = old["ports"]
    assert isinstance(sockets, dict) and isinstance(ports, dict)
    reservations = Reservations.of(plans)

    # allocate's reserved seats: the endpoint's socket, then one per further node.
    seats = {name: [s for key, s in sockets.items() if key.split("_")[0] == name] for name in names}
    assert reservations.seats() == {name: s for name, s in seats.items() if s}
    for name in names:
        assert reservations.socket_of(name) == sockets.get(name)
        prefix = name + INSTANCE_SEPARATOR
        own = [key for key in sockets if key.startswith(prefix)]
        assert reservations.extra_nodes(name) == {int(key.removeprefix(prefix)) for key in own}
        others = {s for key, s in sockets.items() if key != name and key not in own}
        assert reservations.sockets_held_except(name) == others
        assert reservations.ports_except(name) == {p for k, p in ports.items() if k != name}
    assert reservations.ports() == ports
    assert reservations.gpus() == old["gpus"]
    assert reservations.gpus_except({"gpu"}) == {}
    instance_ports = old["instance_ports"]
    assert isinstance(instance_ports, dict)
    listeners = reservations.listeners()
    owned = {p: name for name, ports in instance_ports.items() for p in ports}
    owned |= {p: name for name, p in ports.items()}
    assert {p: listener.endpoint for p, listener in listeners.items()} == owned
    assert all(listener.reserved for listener in listeners.values())
