"""llama.cpp endpoints of several instances (docs/instances.md): the same layout as vLLM's sets
on the fake dual-socket hosts (one llama-server per NUMA node, disjoint cores, memory bound to
its node), each instance's threads its own cores, its fit its share of the node, the balancer in
front; the units through the real systemd-analyze and HAProxy."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.cli.plan import confirmation_table, plan_json
from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.errors import InputError
from epycd.export import export_kube
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.render.balancer import HAPROXY, haproxy_config
from epycd.stack import shipped_stack
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_llama_plan import VERSION, LlamaWorkspace, words_after
from tests.render.realtools import verify, write_units
from tests.render.test_balancer import cached_haproxy, haproxy_check

HostOf = Callable[..., HostFacts]


def llama_members(decided: EndpointDecisions) -> list[LlamaServer]:
    """A llama.cpp set's servers."""
    members = list(decided.members)
    assert all(isinstance(m, LlamaServer) for m in members), decided.kind
    return [m for m in members if isinstance(m, LlamaServer)]


def planned_set(lw: LlamaWorkspace, text: str) -> tuple[Plan, EndpointDecisions]:
    lw.endpoint("chat", text)
    result = lw.plan()["chat"]
    assert result.plan is not None, [e.text for e in result.errors]
    decisions = result.plan.decisions
    assert decisions.kind == "llama-set", decisions.kind
    return result.plan, decisions


def unit_value(text: str, key: str) -> str:
    found = re.search(rf"^{key}=(.*)$", text, re.M)
    assert found is not None, f"{key}= missing"
    return found.group(1)


def check_members(plan: Plan, decided: EndpointDecisions, host: HostFacts) -> None:
    """Disjoint whole cores within each member's node(s) and socket, one thread per core,
    its unit pinned and bound there, on its own loopback port, fitting its share."""
    seen: set[int] = set()
    for member in llama_members(decided):
        assert isinstance(member, LlamaServer)
        cpus = parse_cpulist(member.cpus)
        assert not seen & set(cpus)
        seen |= set(cpus)
        sock = next(s for s in host.socket_topology if s.socket == member.socket)
        assert set(cpus) <= set(parse_cpulist(sock.physical_cpus))
        assert set(cpus) <= {cpu for node in member.numa_nodes for cpu in host.node(node).cpus}
        assert member.invocation.threads == len(cpus)
        assert words_after(member.server_args, "--threads") == str(len(cpus))
        assert member.host == "127.0.0.1" and member.port != decided.port
        assert words_after(member.server_args, "--port") == str(member.port)
        assert member.fit.fits
        unit = plan.units[f"{member.unit_name}.service"]
        assert parse_cpulist(unit_value(unit, "CPUAffinity")) == cpus
        assert unit_value(unit, "NUMAPolicy") == "bind"
        assert parse_cpulist(unit_value(unit, "NUMAMask")) == member.numa_nodes
        assert f"--threads {len(cpus)}" in unit_value(unit, "ExecStart")
    assert len({m.port for m in llama_members(decided)}) == len(llama_members(decided))


def test_nps4_host_wide_auto_is_one_llama_server_per_numa_node(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps4"))
    plan, decided = planned_set(lw, 'instances = "auto"\nplacement = "host"\nport = 8100\n')
    assert [m.numa_nodes for m in llama_members(decided)] == [[n] for n in range(8)]
    assert [m.socket for m in llama_members(decided)] == [0] * 4 + [1] * 4
    assert all(m.invocation.threads == 24 for m in llama_members(decided))
    assert decided.socket is None and decided.sockets == [0, 1]
    check_members(plan, decided, lw.host)
    node_gib = lw.host.node(0).memory_available_bytes / 2**30
    assert llama_members(decided)[0].fit.available_gb <= node_gib + 0.1
    assert set(plan.units) == {"epyc-llm-chat.service"} | {
        f"epyc-llm-chat_{i}.service" for i in range(1, 9)
    }
    balancer = plan.units["epyc-llm-chat.service"]
    assert HAPROXY in unit_value(balancer, "ExecStart")
    config = haproxy_config(decided)
    assert [int(p) for p in re.findall(r"server instance-\d+ 127\.0\.0\.1:(\d+)", config)] == [
        m.port for m in llama_members(decided)
    ]


def test_the_balancer_unit_names_the_engine_of_its_instances(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """`systemctl status` of a llama.cpp set's balancer says what it fronts: llama.cpp's
    servers, not vLLM's."""
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))
    plan, decided = planned_set(lw, 'instances = 2\nplacement = "host"\n')
    assert unit_value(plan.units["epyc-llm-chat.service"], "Description") == (
        f"epyc-llm chat: HAProxy in front of 2 llama.cpp instances of {decided.model}"
    )


def test_two_sockets_nps1_two_instances_take_a_socket_each(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))
    plan, decided = planned_set(lw, 'instances = 2\nplacement = "host"\n')
    assert [m.socket for m in llama_members(decided)] == [0, 1]
    for member in llama_members(decided):
        sock = next(s for s in lw.host.socket_topology if s.socket == member.socket)
        assert member.cpus == sock.physical_cpus and member.invocation.threads == 96
    check_members(plan, decided, lw.host)


def test_instances_sharing_a_node_share_its_memory(ws: PlanWorkspace, host_of: HostOf) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps4"))
    (ws.tmp / "alone").mkdir()
    alone = LlamaWorkspace(PlanWorkspace(ws.tmp / "alone"), lw.host)
    _, one = planned_set(alone, "instances = 4\n")
    plan, two = planned_set(lw, "instances = 8\n")
    assert [m.numa_nodes for m in two.members] == [[n // 2] for n in range(8)]
    check_members(plan, two, lw.host)
    assert llama_members(two)[0].fit.available_gb == pytest.approx(
        llama_members(one)[0].fit.available_gb / 2, abs=0.02
    )


def test_plan_json_and_table_show_the_llama_set(ws: PlanWorkspace, host_of: HostOf) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps4"))
    lw.endpoint("chat", 'instances = "auto"\nmin_ready = 3\n')
    result = lw.plan()["chat"]
    data = plan_json(result)
    assert data["kind"] == "llama-set" and data["engine"] == "llama.cpp"
    assert data["vllm_version"] is None and data["llama_version"] == VERSION
    assert data["instances"]["count"] == 4 and data["instances"]["min_ready"] == 3
    members = data["instances"]["members"]
    assert [m["numa_nodes"] for m in members] == [[0], [1], [2], [3]]
    assert all(m["kind"] == "llama" and m["server_args"] for m in members)
    assert data["memory"]["fits"] is True and data["server_args"] is None
    assert data["cpus"] == "0-95" and data["numa_nodes"] == [0, 1, 2, 3], data["cpus"]
    assert all(data[key] is None for key in ("omp_cpus", "vllm_args", "env", "image")), data
    text = confirmation_table(result, lw.host)
    assert "4 (instances = auto, placement socket, ready with 3) behind HAProxy" in text
    assert "epyc-llm-chat_3: socket 0, NUMA 2, pinned 48-71, 24 threads" in text
    assert "llama.cpp" in text and "OpenMP" not in text


def test_the_units_verify_and_haproxy_accepts_the_configuration(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps4"))
    plan, decided = planned_set(lw, 'instances = "auto"\nplacement = "host"\n')
    done = haproxy_check(haproxy_config(decided), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    binary, _ = cached_haproxy()
    units = {n: t.replace(HAPROXY, str(binary)) for n, t in plan.units.items()}
    verify(write_units(tmp_path / "units", units))


def test_the_kubernetes_export_refuses_a_llama_set_naming_the_engine(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps4"))
    plan, _ = planned_set(lw, "instances = 2\n")
    with pytest.raises(InputError) as refused:
        export_kube(plan, lw.host, shipped_stack())
    assert refused.value.key == "engine" and "llama.cpp" in str(refused.value)


def test_llama_servers_of_one_core_each_carry_no_warning_of_vllms_front_end(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """The warning of one-core instances is vLLM's (its OpenMP bind keeps a core for its
    front end); llama-server's threads take every core it is given."""
    lw = LlamaWorkspace(ws, host_of("vm-zen5-24g"))
    _, decided = planned_set(lw, "instances = 2\n")
    assert [m.cpus for m in decided.members] == ["0", "1"]
    assert not [w for w in decided.warnings if "front end" in w]
