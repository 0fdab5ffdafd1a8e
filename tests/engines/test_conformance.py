"""What every engine's endpoints must do, the same checks for each (`ENGINES` of
tests/engines/endpoints.py), one server or a set: planned on every fake CPU host within one
socket's cores and nodes, fitting, on distinct loopback ports; units that the real
systemd-analyze (and Quadlet, for a container) accepts; a socket that does not exist
refused with the key and nothing else disturbed; what it holds reserved from the next
endpoint; approved through the real `epycctl`, then a change to its plan seen as drift, the
approved record's servers as the plan's and status's columns from it; epycd's plan series
for each server; and its Kubernetes export written, or refused with its engine's reason.

This is the safety net of the engine interface (docs/adding-an-engine.md): every registered
engine passes it as it is, and so does the test-only toy engine (test_toy_engine.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from epycd.approval.record import approval_path, load_approval
from epycd.approval.state import endpoint_states
from epycd.engines import engine_named
from epycd.errors import InputError
from epycd.export import export_kube
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.metrics.series import endpoint_series
from epycd.plan.endpoint import Plan, server_types
from epycd.plan.invocation_facts import InvocationFacts
from epycd.plan.model import CpuServer
from epycd.plan.placement.reservations import Reservations
from epycd.render import render_units
from epycd.render.balancer import HAPROXY
from epycd.stack import shipped_stack
from epycd.status.handoff import handoff
from epycd.status.machine import described_plan
from tests.approval.conftest import ApprovalSandbox
from tests.engines.endpoints import ENGINES, SHAPES, endpoint_text
from tests.hosts import CATALOGUE
from tests.plan.conftest import PODMAN_5, PlanWorkspace
from tests.plan.test_set_reservations import held_by
from tests.render.realtools import quadlet_dryrun, verify, write_units
from tests.render.test_balancer import cached_haproxy

HostOf = Callable[..., HostFacts]
CPU_HOSTS = sorted(n for n, shape in CATALOGUE.items() if not shape.gpus and n != "xeon")
"""The fake hosts an endpoint on the CPU is planned on (an Intel Xeon is refused: not an
EPYC)."""
SET_HOSTS = [n for n in CPU_HOSTS if CATALOGUE[n].node_memory_gib >= 16]
"""Those with room for two servers of the test model (the 10.8 GiB VMs hold one vLLM)."""
HOSTS = [(shape, n) for shape in SHAPES for n in (SET_HOSTS if shape == "set" else CPU_HOSTS)]


def planned(ws: PlanWorkspace, host: HostFacts, name: str = "chat") -> Plan:
    result = ws.plan(host)[name]
    assert result.plan is not None, [e.text for e in result.errors]
    return result.plan


def check_servers(plan: Plan, host: HostFacts) -> None:
    """Each server on one socket's physical cores and that socket's nodes, fitting; no
    core shared; every port its own; the endpoint on loopback."""
    servers = list(plan.decisions.servers)
    seen: set[int] = set()
    ports = {plan.decisions.port}
    for server in servers:
        socket = host.socket(server.socket)
        assert socket is not None, server.socket
        cpus = set(parse_cpulist(server.cpus))
        assert cpus and cpus <= set(parse_cpulist(socket.physical_cpus)), server.cpus
        assert set(server.numa_nodes) <= set(socket.numa_nodes), server.numa_nodes
        assert not cpus & seen
        seen |= cpus
        assert isinstance(server, CpuServer) and server.engine == plan.decisions.engine
        assert server.cpu_fit.fits, server.unit_name
        if len(servers) > 1:
            assert server.port not in ports and server.host == "127.0.0.1"
            ports.add(server.port)
    assert plan.decisions.host == "127.0.0.1"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("shape", "host_name"), HOSTS)
def test_it_plans_on_every_fake_host(
    ws: PlanWorkspace, host_of: HostOf, engine: str, shape: str, host_name: str
) -> None:
    host = host_of(host_name)
    ws.endpoint("chat", endpoint_text(ws.tmp, engine, shape))
    plan = planned(ws, host)
    assert plan.decisions.engine == engine
    assert (plan.decisions.instances is not None) == (shape == "set")
    check_servers(plan, host)


@pytest.mark.quadlet
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_its_units_pass_the_real_tools(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path, engine: str, shape: str
) -> None:
    ws.endpoint("chat", endpoint_text(ws.tmp, engine, shape))
    plan = planned(ws, host_of("genoa-9654-2s-nps4"))
    services = {n: t for n, t in plan.units.items() if n.endswith(".service")}
    containers = {n: t for n, t in plan.units.items() if n.endswith(".container")}
    assert set(services) | set(containers) == set(plan.units)
    if containers:
        write_units(tmp_path / "quadlet", containers)
        generated = quadlet_dryrun(tmp_path / "quadlet")
        assert len(generated) == len(containers)
        services |= generated
    haproxy, _ = cached_haproxy()
    services = {n: t.replace(HAPROXY, str(haproxy)) for n, t in services.items()}
    verify(write_units(tmp_path / "units", services))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_socket_that_is_not_there_is_refused_alone(
    ws: PlanWorkspace, host_of: HostOf, engine: str, shape: str
) -> None:
    host = host_of("genoa-9654-2s-nps1")
    ws.endpoint("good", endpoint_text(ws.tmp, engine, "one"))
    ws.endpoint("bad", endpoint_text(ws.tmp, engine, shape) + "socket = 7\n")
    results = ws.plan(host)
    assert results["bad"].plan is None
    assert [e.key for e in results["bad"].errors] == ["socket"], results["bad"].errors
    good = results["good"].plan
    assert good is not None
    check_servers(good, host)


def assert_each_fact_once(record: dict[str, Any]) -> None:
    """The endpoint holds what its servers share once, each server only what is its own,
    and nothing repeats what a server's typed invocation holds (`InvocationFacts`)."""
    decisions = record["plan"]["decisions"]
    servers = decisions["servers"]
    for server in servers:
        repeated = {key for key, value in server.items() if decisions.get(key, server) == value}
        assert not repeated, (server["kind"], repeated)
        kind = server_types()[server["kind"]]
        if not issubclass(kind, InvocationFacts) or server.get("invocation") is None:
            continue
        invocation = kind.invocation_type.model_validate(server["invocation"])
        facts = set(kind.invocation_facts(invocation))
        assert not facts & set(server), server["kind"]
        if decisions.get("instances") is None:
            assert not facts & set(decisions), (server["kind"], facts & set(decisions))
        for field, nested in kind.nested_invocation_facts(invocation).items():
            assert not set(nested) & set(server[field]), (server["kind"], field)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_approved_then_a_change_is_drift(env: ApprovalSandbox, engine: str, shape: str) -> None:
    (env.tmp / "planning").mkdir()
    ws = PlanWorkspace(env.tmp / "planning")
    folders = {"unit_dir": env.settings.unit_dir, "quadlet_dir": env.settings.quadlet_dir}
    ws.settings = ws.settings.model_copy(update=folders)
    host = env.host().model_copy(update={"runtimes": RuntimeFacts(podman=PODMAN_5)})
    ws.endpoint("chat", endpoint_text(ws.tmp, engine, shape))
    plan = planned(ws, host)
    env.set_plans(plan)

    done = env.epycctl("approve", "chat", "--yes", "--no-start", "--no-pull")

    assert done.returncode == 0, done.stderr
    record = load_approval(env.settings, "chat")
    assert record is not None and record.fingerprint == plan.fingerprint
    assert record.plan.decisions.servers == plan.decisions.servers
    assert render_units(record.plan.decisions) == plan.units  # the record's facts, read back
    assert_each_fact_once(json.loads(approval_path(env.settings, "chat").read_text()))
    for name, text in plan.units.items():
        folder = env.settings.quadlet_dir if name.endswith(".container") else env.settings.unit_dir
        assert (folder / name).read_text() == text, name
    [state] = endpoint_states(env.settings, {"chat": plan})
    assert state.state == "approved"
    shown = described_plan(record.plan)
    assert (shown["cpus"], shown["port"]) == (plan.decisions.cpus, plan.decisions.port)
    assert handoff(record.plan).base_url.startswith(shown["url"])

    ws.endpoint("chat", endpoint_text(ws.tmp, engine, shape) + "max_model_len = 512\n")
    changed = planned(ws, host)
    assert changed.fingerprint != plan.fingerprint
    [state] = endpoint_states(env.settings, {"chat": changed})
    assert state.state == "changed-needs-approval"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_what_it_holds_is_reserved(
    ws: PlanWorkspace, host_of: HostOf, engine: str, shape: str
) -> None:
    host = host_of("genoa-9654-2s-nps4")
    ws.endpoint("first", endpoint_text(ws.tmp, engine, shape))
    first = planned(ws, host, "first")
    ws.endpoint("next", endpoint_text(ws.tmp, engine, "one"))
    results = ws.plan(host, reservations=Reservations.of({"first": first}))
    again, after = results["first"].plan, results["next"].plan
    assert again is not None and held_by(again) == held_by(first)
    assert after is not None, [e.text for e in results["next"].errors]
    for mine, theirs in zip(held_by(after), held_by(first), strict=True):
        assert not mine & theirs, sorted(mine & theirs)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_its_plan_series_are_each_servers(
    ws: PlanWorkspace, host_of: HostOf, engine: str, shape: str
) -> None:
    ws.endpoint("chat", endpoint_text(ws.tmp, engine, shape))
    plan = planned(ws, host_of("genoa-9654-2s-nps4"))
    servers = list(plan.decisions.servers)
    series = {m.name: m for m in endpoint_series([], {"chat": plan}, datetime.now(UTC))}

    def values(name: str) -> list[float]:
        return sorted(sample.value for sample in series["epyc_llm_" + name].samples)

    assert values("endpoint_instances") == [len(servers)]
    assert values("endpoint_instances_ready") == [0]
    assert values("plan_cores") == sorted(len(parse_cpulist(s.cpus)) for s in servers)
    assert values("plan_max_model_len") == sorted(s.max_model_len for s in servers)
    assert values("plan_max_num_seqs") == sorted(s.max_num_seqs for s in servers)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shape", SHAPES)
def test_its_export_is_written_or_refused_with_its_reason(
    ws: PlanWorkspace, host_of: HostOf, engine: str, shape: str
) -> None:
    host = host_of("genoa-9654-2s-nps1")  # a pod gets one NUMA node: a socket is one here
    ws.endpoint("chat", endpoint_text(ws.tmp, engine, shape))
    plan = planned(ws, host)
    reason = engine_named(engine).no_kube_export
    if reason is None:
        done = export_kube(plan, host, shipped_stack(), model_volume="models")
        kinds = {o["kind"] for o in done.objects}
        assert {"Deployment", "Service"} <= kinds, kinds
        return
    with pytest.raises(InputError) as refused:
        export_kube(plan, host, shipped_stack())
    assert refused.value.key == "engine" and reason in refused.value.message
