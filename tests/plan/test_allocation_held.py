"""Approved endpoints hold their socket and port whether they run or not, and an endpoint
that is refused takes no socket or port from the others (fake hosts, no real ports)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.ports import Listener
from tests.plan.conftest import PlanWorkspace, cpu, write_model
from tests.plan.test_sizing import BIG

HostOf = Callable[..., HostFacts]
FIRST_PORT = 8000
HUGE = {**BIG, "num_hidden_layers": 240}
"""About 400 GiB of weights: more than a socket of the Milan host holds."""


def placed(result: EndpointResult) -> tuple[int, int, set[int]]:
    assert result.plan is not None, [p.text for p in result.errors]
    decisions = cpu(result.plan)
    return decisions.socket, decisions.port, set(parse_cpulist(decisions.cpus))


def test_a_new_file_does_not_take_the_port_of_an_approved_endpoint_not_running(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("b")
    ws.endpoint("a")
    results = ws.plan(
        host_of("milan-7763-2s"), approved_sockets={"b": 0}, approved_ports={"b": FIRST_PORT}
    )
    b_socket, b_port, b_cpus = placed(results["b"])
    a_socket, a_port, a_cpus = placed(results["a"])
    assert (b_socket, b_port) == (0, FIRST_PORT)
    assert a_port != FIRST_PORT and a_socket == 1 and not a_cpus & b_cpus


def test_an_approved_endpoint_without_a_plan_now_still_holds_its_socket_and_port(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Its file is gone or broken, but its units are installed and may run."""
    ws.endpoint("a")
    ws.endpoint("broken", "unknown_key = 1\n")
    held = {"broken": 0, "gone": 1}
    results = ws.plan(
        host_of("genoa-9654-2s-nps4"),
        approved_sockets=held,
        approved_ports={"broken": FIRST_PORT, "gone": FIRST_PORT + 1},
    )
    _socket, port, _cpus = placed(results["a"])
    assert port == FIRST_PORT + 2
    assert len(cpu(results["a"].plan).numa_nodes) == 2


def test_asking_for_an_approved_endpoints_port_or_socket_is_refused_naming_it(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("a", f"port = {FIRST_PORT}\n")
    ws.endpoint("c", "socket = 0\n")
    results = ws.plan(
        host_of("milan-7763-2s"), approved_sockets={"b": 0}, approved_ports={"b": FIRST_PORT}
    )
    [port_error] = results["a"].errors
    assert port_error.key == "port" and "approved endpoint b" in port_error.message
    assert results["a"].exit_code == 1
    [socket_error] = results["c"].errors
    assert socket_error.key == "socket" and "taken by b" in socket_error.message


def test_a_refused_port_takes_no_socket(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a", f"port = {FIRST_PORT}\n")
    ws.endpoint("b")
    foreign = {FIRST_PORT: Listener(pid=None, process=None, endpoint=None)}
    results = ws.plan(host_of("milan-7763-2s"), listeners=foreign)
    assert results["a"].plan is None and results["a"].errors[0].key == "port"
    assert placed(results["b"])[0] == 0


def test_a_refused_socket_takes_no_port(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a", "socket = 7\n")
    ws.endpoint("b")
    results = ws.plan(host_of("milan-7763-2s"))
    assert results["a"].plan is None and results["a"].errors[0].key == "socket"
    assert placed(results["b"])[1] == FIRST_PORT


def test_a_model_that_does_not_fit_takes_no_socket_or_port(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    big = write_model(tmp_path / "models" / "huge", HUGE)
    ws.endpoint("a", f'model = "{big}"\n')
    ws.endpoint("b")
    results = ws.plan(host_of("milan-7763-2s"))
    assert results["a"].plan is None and "does not fit" in results["a"].errors[0].message
    assert placed(results["b"])[:2] == (0, FIRST_PORT)
    decisions = results["a"].decisions
    assert decisions is not None
    assert decisions.errors == results["a"].errors  # one shape: the result's and the decisions'
    assert (decisions.errors[0].key, decisions.errors[0].exit_code) == ("max_model_len", 1)


def test_freeing_a_refused_endpoints_socket_never_costs_another_its_plan(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Socket 0 has no memory free: `a` does not fit there; `b` must not be moved onto it."""
    host = host_of("genoa-9654-2s-nps1")
    nodes = [
        node.model_copy(update={"memory_available_bytes": 0}) if node.node == 0 else node
        for node in host.nodes
    ]
    short = host.model_copy(update={"nodes": nodes})
    ws.endpoint("a")
    ws.endpoint("b")
    results = ws.plan(short)
    assert results["a"].plan is None and "does not fit" in results["a"].errors[0].message
    assert placed(results["b"])[0] == 1
