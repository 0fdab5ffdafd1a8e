"""One address book (epycd.plan.placement.reservations.address_book): the gateway's ports
(gateway_listen, gateway_metrics_listen, and the approved gateway's own), epycd's
metrics_listen, every approved endpoint's public, instance and engine ports, running or not,
and the ports every endpoint file asks for are reserved against each other, with the real
planner: an explicit port on one of them is refused naming both holders, the key and the
fix, and no automatic choice (a public "auto" port, an instance's, an on-demand engine's)
lands on one. Running out of engine ports says the range, who holds it and the fix."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from epycd.approval.record import current_approver
from epycd.gateway.apply import GatewayApproval, approval_path
from epycd.host.facts import HostFacts
from epycd.paths import gateway_approval_file
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.reservations import Reservations
from tests.plan.conftest import PlanWorkspace

HostOf = Callable[..., HostFacts]
HOST = "genoa-9654-2s-nps4"
"""Eight NUMA nodes: room for sets of instances and on-demand endpoints side by side."""


def planned(results: dict[str, EndpointResult], name: str) -> Plan:
    plan = results[name].plan
    assert plan is not None, [e.text for e in results[name].errors]
    return plan


def all_ports(plan: Plan) -> set[int]:
    """Every port the plan's units listen on: public, instances', engine's."""
    decided = plan.decisions
    ports = {decided.port, *(m.port for m in decided.members)}
    if decided.on_demand is not None:
        ports.add(decided.on_demand.engine_port)
    return ports


def with_gateway(ws: PlanWorkspace, listen: str, metrics: str = "127.0.0.1:9465") -> None:
    ws.settings = ws.settings.model_copy(
        update={"gateway_listen": listen, "gateway_metrics_listen": metrics}
    )


def test_an_explicit_port_on_the_gateways_is_refused_naming_both(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    with_gateway(ws, "0.0.0.0:8443")
    path = ws.endpoint("a", "port = 8443\n")
    ws.endpoint("b", "")
    results = ws.plan(host_of(HOST))
    refused = results["a"]
    assert refused.plan is None
    error = refused.errors[0]
    assert error.key == "port" and error.file == str(path), error
    assert "gateway_listen" in error.text and str(ws.settings.daemon_conf) in error.text
    assert error.fix is not None and "auto" in error.fix and "gateway_listen" in error.fix
    assert planned(results, "b").decisions.port != 8443


def test_auto_ports_skip_the_gateways_and_epycds_addresses(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """The gateway on 8000, its metrics on 8001, epycd's on 8002 (the stack's first port
    is 8000): the "auto" endpoints, their instances and engines land on none of them."""
    with_gateway(ws, "[::]:8000", "127.0.0.1:8001")
    ws.settings = ws.settings.model_copy(update={"metrics_listen": "127.0.0.1:8002"})
    ws.endpoint("a", "")
    ws.endpoint("set", "instances = 2\n")
    ws.endpoint("od", "on_demand = true\n")
    results = ws.plan(host_of(HOST))
    used = set().union(*(all_ports(planned(results, n)) for n in ("a", "set", "od")))
    assert not used & {8000, 8001, 8002}, sorted(used)


def test_the_approved_gateways_port_stays_reserved_while_its_units_are_installed(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """gateway_listen unset since, the gateway's approval still there (its units installed,
    stopped): its address is still the gateway's."""
    record = approval_path(ws.settings)
    assert record == gateway_approval_file(ws.settings.state_dir), "one record, one path"
    record.parent.mkdir(parents=True)
    record.write_text(
        GatewayApproval(
            approved_at=datetime.now(UTC),
            approver=current_approver(),
            listen="0.0.0.0:8000",
            metrics_listen="127.0.0.1:9465",
            tls_cert_file=None,
            unit_sha256="0" * 64,
        ).model_dump_json()
    )
    path = ws.endpoint("a", "port = 8000\n")
    ws.endpoint("b", "")
    results = ws.plan(host_of(HOST))
    error = results["a"].errors[0]
    assert error.key == "port" and error.file == str(path), error
    assert "approved gateway" in error.text and str(record) in error.text, error.text
    assert planned(results, "b").decisions.port != 8000


def test_an_approved_stopped_endpoints_engine_and_instance_ports_are_refused_naming_it(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Approved, not running (no listener at all): an explicit port on its engine port or
    an instance's is refused naming the approved endpoint and its file."""
    host = host_of(HOST)
    od_file = ws.endpoint("od", "on_demand = true\n")
    set_file = ws.endpoint("set", "instances = 2\n")
    first = ws.plan(host)
    approved = {name: planned(first, name) for name in ("od", "set")}
    engine = approved["od"].decisions.on_demand
    assert engine is not None
    instance = approved["set"].decisions.members[1].port
    ws.endpoint("x", f"port = {engine.engine_port}\n")
    ws.endpoint("y", f"port = {instance}\n")
    results = ws.plan(host, reservations=Reservations.of(approved))
    for name, holder, file in (("x", "od", od_file), ("y", "set", set_file)):
        error = results[name].errors[0]
        assert error.key == "port", error
        assert f"approved endpoint {holder}" in error.text and str(file) in error.text, error
        assert error.fix is not None and "auto" in error.fix, error.fix
    for name in ("od", "set"):
        assert planned(results, name).fingerprint == approved[name].fingerprint


def test_a_broken_endpoint_files_port_is_not_given_to_an_auto_endpoint(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """A file that asks for 8000 but does not plan (its model is missing) still holds 8000:
    once fixed it would collide with whatever took it."""
    ws.endpoint("broken", 'model = "/nowhere/at/all"\nport = 8000\n')
    ws.endpoint("b", "")
    results = ws.plan(host_of(HOST))
    assert results["broken"].plan is None
    assert planned(results, "b").decisions.port != 8000


def test_instances_and_engines_planned_together_never_share_a_port(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Two sets and an on-demand endpoint with adjacent public ports in one plan: every
    port of every unit is distinct."""
    ws.endpoint("s1", "instances = 2\nport = 8100\n")
    ws.endpoint("s2", "instances = 2\nport = 8101\n")
    ws.endpoint("od", "on_demand = true\nport = 8102\n")
    results = ws.plan(host_of(HOST))
    seen: list[int] = []
    for name in ("s1", "s2", "od"):
        seen += sorted(all_ports(planned(results, name)))
    assert len(seen) == len(set(seen)), seen


def test_running_out_of_engine_ports_says_the_range_who_holds_it_and_the_fix(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    path = ws.endpoint("od", "on_demand = true\nport = 65534\n")
    ws.endpoint("top", "port = 65535\n")
    results = ws.plan(host_of(HOST))
    assert results["od"].plan is None
    error = next(e for e in results["od"].errors if e.key == "port")
    assert error.file == str(path), error
    assert "65535-65535" in error.text and "top" in error.text, error.text
    assert error.fix is not None and "port" in error.fix and "on-demand" in error.fix
