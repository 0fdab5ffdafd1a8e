"""Socket choice and multi-endpoint allocation on fake hosts."""

from __future__ import annotations

from collections.abc import Callable

from epycd.engines.vllm.plan.route import VllmRoute
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.plan.pipeline.result import EndpointResult
from tests.hosts import CATALOGUE
from tests.plan.conftest import PlanWorkspace, cpu

HostOf = Callable[..., HostFacts]


def planned(results: dict[str, EndpointResult]) -> dict[str, tuple[int, list[int], set[int]]]:
    out = {}
    for name, result in results.items():
        assert result.plan is not None, [p.text for p in result.errors]
        plan = cpu(result.plan)
        out[name] = (plan.socket, plan.numa_nodes, set(parse_cpulist(plan.cpus)))
    return out


def test_socket_1_of_dual_genoa_nps4_gets_its_physical_cores_and_nodes_4_to_7(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("llm", "socket = 1\n")
    host = host_of("genoa-9654-2s-nps4")
    whole_plan = ws.plan(host)["llm"].plan
    assert whole_plan is not None
    plan = cpu(whole_plan)
    assert plan.socket == 1 and plan.numa_nodes == [4, 5, 6, 7]
    expected = parse_cpulist(host.socket(1).physical_cpus)
    assert parse_cpulist(plan.cpus) == expected and len(expected) == 96
    siblings = {t for threads in host.socket(1).smt_siblings.values() for t in threads}
    assert siblings and not siblings & set(expected)
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == plan.omp_cpus
    assert parse_cpulist(plan.omp_cpus) == expected[:-2], "96 cores leave 2 to the front end"
    assert plan.socket_reason == "forced by socket = 1"
    assert any("NPS4" in w for w in plan.warnings)
    container = whole_plan.units["epyc-llm-llm.container"]
    assert f"--cpuset-cpus={plan.cpus}" in container and "--cpuset-mems=4-7" in container


def test_single_socket_is_socket_0(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm")
    plan = cpu(ws.plan(host_of("bergamo-9754"))["llm"].plan)
    assert plan.socket == 0 and plan.socket_reason == "single socket"
    assert not any("NPS" in w for w in plan.warnings)


def test_forced_socket_that_does_not_exist_is_an_error(ws: PlanWorkspace, host_of: HostOf) -> None:
    path = ws.endpoint("llm", "socket = 2\n")
    result = ws.plan(host_of("genoa-9654-2s-nps1"))["llm"]
    assert result.exit_code == 2
    assert (result.errors[0].file, result.errors[0].key) == (str(path), "socket")
    assert "socket 2 does not exist" in result.errors[0].message


def test_load_aware_choice(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm")
    host = host_of("genoa-9654-2s-nps1")
    both_idle = host.model_copy(update={"socket_busy_pct": {0: 3.0, 1: 1.0}})
    plan = cpu(ws.plan(both_idle)["llm"].plan)
    assert plan.socket == 0 and "idle" in plan.socket_reason

    zero_busy = host.model_copy(update={"socket_busy_pct": {0: 60.0, 1: 2.0}})
    plan = cpu(ws.plan(zero_busy)["llm"].plan)
    assert plan.socket == 1 and not plan.warnings[2:]

    all_busy = host.model_copy(update={"socket_busy_pct": {0: 90.0, 1: 40.0}})
    plan = cpu(ws.plan(all_busy)["llm"].plan)
    assert plan.socket == 1
    assert any("every socket is busy" in w for w in plan.warnings)


def test_two_endpoints_on_two_sockets_are_disjoint(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a")
    ws.endpoint("b")
    host = host_of("genoa-9654-2s-nps1")
    got = planned(ws.plan(host))
    assert {got["a"][0], got["b"][0]} == {0, 1}
    assert not got["a"][2] & got["b"][2]
    assert not set(got["a"][1]) & set(got["b"][1])
    for name in ("a", "b"):
        assert got[name][2] == set(parse_cpulist(host.socket(got[name][0]).physical_cpus))


def test_forced_and_auto_endpoints_share_sockets_without_overlap(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("a")
    ws.endpoint("b", "socket = 0\n")
    got = planned(ws.plan(host_of("genoa-9654-2s-nps1")))
    assert got["b"][0] == 0 and got["a"][0] == 1


def test_three_endpoints_split_nps4_sockets_by_numa_node(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    for name in ("a", "b", "c"):
        ws.endpoint(name)
    host = host_of("genoa-9654-2s-nps4")
    results = ws.plan(host)
    got = planned(results)
    nodes = [n for _, node_list, _ in got.values() for n in node_list]
    assert len(nodes) == len(set(nodes)) == 8
    cpus = [got[name][2] for name in got]
    assert all(not cpus[i] & cpus[j] for i in range(3) for j in range(i + 1, 3))
    for name, (socket, node_list, cpu_set) in got.items():
        node_cpus = {c for n in node_list for c in host.node(n).cpus}
        assert cpu_set == node_cpus & set(parse_cpulist(host.socket(socket).physical_cpus))
        assert set(node_list) <= set(host.socket(socket).numa_nodes)
        plan = cpu(results[name].plan)
        node_total = sum(host.node(n).memory_total_bytes for n in node_list) / 1024**3
        assert plan.memory.available_gb < node_total
    shared = [name for name, (s, _, _) in got.items() if [x[0] for x in got.values()].count(s) == 2]
    assert len(shared) == 2
    assert sorted(len(got[name][1]) for name in shared) == [2, 2]


def test_three_endpoints_on_nps1_is_a_clear_error_for_one(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    for name in ("a", "b", "c"):
        ws.endpoint(name)
    results = ws.plan(host_of("genoa-9654-2s-nps1"))
    assert [n for n, r in results.items() if r.plan is not None] == ["a", "b"]
    error = results["c"].errors[0]
    assert results["c"].exit_code == 1 and error.key == "socket"
    assert "at most 2 endpoints" in error.message and "NPS2/NPS4" in (error.fix or "")


def test_forcing_a_taken_nps1_socket_is_an_error(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a", "socket = 1\n")
    ws.endpoint("b", "socket = 1\n")
    results = ws.plan(host_of("milan-7763-2s"))
    assert results["a"].plan is not None
    assert "taken by a" in results["b"].errors[0].message
    assert "cannot be split" in results["b"].errors[0].message


def test_nine_endpoints_fill_an_nps4_pair_then_stop(ws: PlanWorkspace, host_of: HostOf) -> None:
    for index in range(9):
        ws.endpoint(f"e{index}")
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    got = planned({n: r for n, r in results.items() if r.plan is not None})
    assert len(got) == CATALOGUE["genoa-9654-2s-nps4"].cpu_nodes == 8
    assert sorted(n for _, nodes, _ in got.values() for n in nodes) == list(range(8))
    assert results["e8"].plan is None and results["e8"].exit_code == 1
    assert "BIOS" not in (results["e8"].errors[0].fix or "")
    route = results["e8"].route
    assert isinstance(route, VllmRoute) and (route.backend, route.runtime) == ("zentorch", "podman")


def test_a_bad_file_takes_no_socket(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a", "unknown_key = 1\n")
    ws.endpoint("b")
    ws.endpoint("c")
    results = ws.plan(host_of("milan-7763-2s"))
    assert results["a"].exit_code == 2 and results["a"].errors[0].key == "unknown_key"
    assert results["b"].plan is not None and results["c"].plan is not None
