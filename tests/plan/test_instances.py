"""One endpoint, many instances (docs/instances.md): the layout the real planner makes on fake
hosts, the units it renders, and the errors of the new keys."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from epycd.approval.check import socket_needs
from epycd.approval.workflow import overlap
from epycd.cli.plan import confirmation_table, plan_json
from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.host.cpulist import parse_cpulist
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.plan.endpoint import InstanceSet, Plan
from epycd.plan.placement.instances import HOST_RESERVED_CORES, SWEET_SPOT_CORES
from epycd.plan.placement.ports import endpoint_of_pid
from epycd.plan.placement.reservations import Reservations
from epycd.render.balancer import haproxy_config
from tests.hosts import CATALOGUE, write_host
from tests.plan.conftest import PODMAN_5, PlanWorkspace, cpu, instance_set, write_model
from tests.sandbox import run_python

HostOf = Callable[..., HostFacts]


def _plan(ws: PlanWorkspace, host: HostFacts, text: str, name: str = "big") -> Plan:
    ws.endpoint(name, text)
    result = ws.plan(host)[name]
    assert not result.errors, [e.text for e in result.errors]
    assert result.plan is not None
    return result.plan


def _set(plan: Plan) -> InstanceSet:
    assert plan.decisions.kind == "set" and plan.decisions.instances is not None
    return plan.decisions.instances


def _members(plan: Plan) -> list[VllmCpuServer]:
    _set(plan)
    return [m for m in plan.decisions.members if isinstance(m, VllmCpuServer)]


def _check_set(plan: Plan, host: HostFacts) -> None:
    """Disjoint CPU sets of whole cores, each on one socket and within its nodes' CPUs, the
    front end on the last core(s), every instance fitting on loopback."""
    seen: set[int] = set()
    for member in _members(plan):
        cpus = parse_cpulist(member.cpus)
        assert not seen & set(cpus)
        seen |= set(cpus)
        sock = next(s for s in host.socket_topology if s.socket == member.socket)
        assert set(cpus) <= set(parse_cpulist(sock.physical_cpus))
        node_cpus = {cpu for node in member.numa_nodes for cpu in host.node(node).cpus}
        assert set(cpus) <= node_cpus
        omp = parse_cpulist(member.omp_cpus)
        front_end = sorted(set(cpus) - set(omp))
        assert front_end and min(front_end) > max(omp)
        assert member.env["VLLM_CPU_OMP_THREADS_BIND"] == member.omp_cpus
        assert member.memory.fits
        assert member.host == "127.0.0.1" and member.port != plan.decisions.port
        assert f"--port {member.port}" in " ".join(member.vllm_args)
    assert len({m.port for m in _members(plan)}) == len(_members(plan))


def test_genoa_nps1_two_sockets_takes_amds_recipe_evenly(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    host = host_of("genoa-9654-2s-nps1")
    plan = _plan(ws, host, 'instances = "auto"\nplacement = "host"\n')
    per_host = (host.physical_cores - HOST_RESERVED_CORES) // SWEET_SPOT_CORES
    members = _members(plan)
    assert len(members) == per_host // 2 * 2
    assert [m.socket for m in members] == [0, 0, 1, 1]
    assert all(len(m.numa_nodes) == 1 for m in members)
    assert any("floor((192 cores - 16) / 32) = 5" in r for r in _set(plan).reasons)
    _check_set(plan, host)
    reason = plan.decisions.socket_reason
    assert "share" not in reason and "2 per" not in reason
    node_available = host.node(0).memory_available_bytes / 2**30
    assert members[0].memory.available_gb <= node_available / 2 + 0.1


def test_genoa_nps4_one_instance_per_node(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-9654-2s-nps4")
    plan = _plan(ws, host, 'instances = "auto"\nplacement = "host"\n')
    members = _members(plan)
    assert [m.numa_nodes for m in members] == [[n] for n in range(8)]
    _check_set(plan, host)
    assert all("never spans nodes" in r for r in _set(plan).reasons)


def test_socket_placement_keeps_the_set_on_its_socket(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-9654-2s-nps4")
    plan = _plan(ws, host, 'instances = "auto"\n')
    assert {m.socket for m in _members(plan)} == {0}
    assert len(_members(plan)) == 4


def test_turin_2x128_without_smt_takes_whole_l3_groups(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("turin-9755-2s-nosmt")
    plan = _plan(ws, host, 'instances = "auto"\nplacement = "host"\n')
    members = _members(plan)
    assert len(members) == 6  # floor((256 - 16) / 32) = 7, 3 per socket
    groups = [set(parse_cpulist(g)) for s in host.socket_topology for g in s.l3_groups]
    for member in members:
        cpus = set(parse_cpulist(member.cpus))
        assert all(group <= cpus or not group & cpus for group in groups)
    _check_set(plan, host)


def test_bergamo_three_instances(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("bergamo-9754")
    plan = _plan(ws, host, 'instances = "auto"\n')
    assert len(_members(plan)) == 3
    _check_set(plan, host)


@pytest.mark.parametrize("host_name", ["vm-16", "vm-zen5"])
def test_small_vm_auto_is_one_plain_endpoint(
    ws: PlanWorkspace, host_of: HostOf, host_name: str
) -> None:
    plain = _plan(ws, host_of(host_name), "", name="plain")
    plan = _plan(ws, host_of(host_name), 'instances = "auto"\n')
    assert plan.instance_set is None
    assert list(plan.units) == ["epyc-llm-big.container"]
    assert cpu(plan).cpus == cpu(plain).cpus and cpu(plan).omp_cpus == cpu(plain).omp_cpus
    assert "= 0 instance(s)" in plan.decisions.socket_reason


def test_default_is_unchanged(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-9654-2s-nps1")
    before = _plan(ws, host, "")
    after = _plan(ws, host, 'instances = 1\nplacement = "socket"\n')
    assert before.instance_set is None and after.instance_set is None
    assert after.units == before.units
    assert after.decisions.socket_reason == before.decisions.socket_reason


def test_memory_cuts_auto_instances(ws: PlanWorkspace, tmp_path: Path) -> None:
    shape = replace(CATALOGUE["bergamo-9754"], node_memory_gib=120.0)
    host = detect_host(write_host(tmp_path / "small-mem", shape), probe_runtimes=False)
    host = host.model_copy(update={"runtimes": RuntimeFacts(podman=PODMAN_5)})
    big = dict(json.loads((ws.model / "config.json").read_text()))
    big.update(hidden_size=8192, intermediate_size=28672, num_hidden_layers=20)
    model = write_model(tmp_path / "models" / "big", big)
    plan = _plan(ws, host, f'model = "{model}"\ninstances = "auto"\n')
    chosen = plan.instance_set
    reasons = chosen.reasons if chosen else [plan.decisions.socket_reason]
    assert any("do not fit" in r for r in reasons), reasons
    count = len(plan.decisions.servers)
    assert count < 3  # 3 by cores
    fit = plan.decisions.cpu_fit
    assert fit is not None and fit.fits


def test_two_one_core_instances_on_two_cores(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("vm-zen5-24g")
    plan = _plan(ws, host, "instances = 2\nport = 18511\n")
    members = _members(plan)
    assert [(m.cpus, m.omp_cpus, m.port) for m in members] == [
        ("0", "0", 18512),
        ("1", "1", 18513),
    ]
    assert any("front end shares the OpenMP core" in w for w in plan.decisions.warnings)
    assert sorted(plan.units) == [
        "epyc-llm-big.service",
        "epyc-llm-big_1.container",
        "epyc-llm-big_2.container",
    ]
    balancer = plan.units["epyc-llm-big.service"]
    assert "Wants=epyc-llm-big_1.service epyc-llm-big_2.service" in balancer
    assert "Requires=" not in balancer
    config = haproxy_config(instance_set(plan))
    assert "balance leastconn" in config and "option httpchk GET /health" in config
    assert "bind 127.0.0.1:18511" in config
    assert "server instance-2 127.0.0.1:18513" in config
    for name in ("epyc-llm-big_1.container", "epyc-llm-big_2.container"):
        assert "PartOf=epyc-llm-big.service" in plan.units[name]


def test_min_ready_below_count_only_changes_the_ready_check(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """The balancer always only `Wants=` its instances (they restart by themselves,
    docs/healing.md); `min_ready` is its ready check's, read from the approval."""
    plan = _plan(ws, host_of("vm-zen5-24g"), "instances = 2\nmin_ready = 1\n")
    balancer = plan.units["epyc-llm-big.service"]
    assert "Wants=epyc-llm-big_1.service epyc-llm-big_2.service" in balancer
    assert "Requires=" not in balancer
    assert "ExecStartPre=+" in balancer and "-m epycd.approval.ready big" in balancer
    assert plan.instance_set is not None and plan.instance_set.min_ready == 1


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("instances = 3\n", "instances", "more than the 2 physical core(s)"),
        ("instances = 2\nmin_ready = 3\n", "min_ready", "more than the 2 instance(s)"),
    ],
)
def test_counts_the_host_cannot_take_are_bad_input(
    ws: PlanWorkspace, host_of: HostOf, text: str, key: str, words: str
) -> None:
    ws.endpoint("big", text)
    result = ws.plan(host_of("vm-zen5"))["big"]
    assert result.plan is None and result.exit_code == 2
    assert [(e.key, e.file) for e in result.errors] == [(key, str(ws.config_dir / "big.toml"))]
    assert words in result.errors[0].message


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("instances = 0\n", "instances", "outside 1-64"),
        ('instances = "many"\n', "instances", "instances"),
        ('placement = "rack"\n', "placement", "placement"),
        ("min_ready = 0\n", "min_ready", "min_ready"),
    ],
)
def test_bad_keys_exit_2_naming_the_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    """Through the real CLI: exit 2, the file and the key named, no traceback, no unit."""
    ws = PlanWorkspace(tmp_path)
    path = ws.endpoint("big", text)
    root = write_host(tmp_path / "host", CATALOGUE["vm-zen5"])
    done = run_python(
        ["-m", "epycd", "plan", "big", "--sample-seconds", "0"],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "EPYCD_CONFIG_DIR": str(ws.config_dir),
            "EPYCD_STATE_DIR": str(tmp_path / "state"),
            "EPYCD_RUN_DIR": str(tmp_path / "run"),
            "EPYCD_UNIT_DIR": str(tmp_path / "systemd"),
            "EPYCD_QUADLET_DIR": str(tmp_path / "quadlet"),
            "EPYCD_HOST_ROOT": str(root),
            "HF_HOME": str(ws.hf_home),
        },
    )
    assert isinstance(done, subprocess.CompletedProcess)
    shown = done.stdout + done.stderr
    assert done.returncode == 2, shown
    assert f"{path}: {key}" in shown and words in shown
    assert "Traceback" not in shown
    assert not (tmp_path / "systemd").exists()


def test_instance_ports_keep_off_other_endpoints_ports(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-9654-2s-nps1")
    ws.endpoint("big", "instances = 2\nport = 18511\n")
    ws.endpoint("other", "port = 18513\n")
    results = ws.plan(host)
    plan, other = results["big"].plan, results["other"].plan
    assert plan is not None and other is not None
    assert [m.port for m in _members(plan)] == [18512, 18514]
    moved = other.model_copy(
        update={"decisions": other.decisions.model_copy(update={"port": 18514})}
    )
    assert overlap(plan, moved) == ["port 18514"]
    assert overlap(plan, other) == []


def test_plan_table_and_json_show_the_layout(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-9654-2s-nps4")
    ws.endpoint("big", 'instances = "auto"\n')
    result = ws.plan(host)["big"]
    text = confirmation_table(result, host)
    assert "4 (instances = auto, placement socket, ready with 4) behind HAProxy" in text
    assert "one per NUMA node (4 nodes, NPS4)" in text
    assert "Instance 3" in text and "epyc-llm-big_3: socket 0, NUMA 2, pinned 48-71" in text
    assert "OpenMP 48-70, front end 71" in text
    data = plan_json(result)
    assert data["instances"]["count"] == 4
    assert [m["numa_nodes"] for m in data["instances"]["members"]] == [[0], [1], [2], [3]]
    single = ws.endpoint("one", "")
    assert single.exists()
    assert plan_json(ws.plan(host)["one"])["instances"] is None


def test_approved_instance_ports_stay_the_sets(ws: PlanWorkspace, host_of: HostOf) -> None:
    """A new "auto" endpoint never takes a port of an approved set's instances, and the set
    keeps them: adding an endpoint file is no drift for the set."""
    host = host_of("genoa-9654-2s-nps1")
    ws.endpoint("big", "instances = 2\n")
    first = ws.plan(host)["big"].plan
    assert first is not None
    held = [m.port for m in _members(first)]
    socket = first.decisions.socket
    assert socket is not None
    ws.endpoint("new", "")
    ws.endpoint("pinned", f"port = {held[1]}\n")
    results = ws.plan(
        host,
        approved_sockets={"big": socket},
        approved_ports={"big": first.decisions.port},
        approved_instance_ports={"big": held},
    )
    again, new = results["big"].plan, results["new"].plan
    assert again is not None and new is not None
    assert [m.port for m in _members(again)] == held
    assert new.decisions.port not in held
    errors = [e.text for e in results["pinned"].errors]
    assert any("an instance port of approved endpoint big" in e for e in errors), errors


def test_an_instance_process_belongs_to_its_endpoint(tmp_path: Path) -> None:
    """A running instance's port is its endpoint's own when re-planning (no drift)."""
    for pid, unit in ((42, "epyc-llm-big_2.service"), (43, "epyc-llm-big.service")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    assert endpoint_of_pid(42, tmp_path) == "big"
    assert endpoint_of_pid(43, tmp_path) == "big"


@pytest.mark.parametrize("host_name", ["genoa-9654-2s-nps1", "genoa-9654-2s-nps4"])
def test_a_host_wide_set_keeps_its_other_sockets(
    ws: PlanWorkspace, host_of: HostOf, host_name: str
) -> None:
    """Approved with placement = "host", the set holds every socket it uses: a new endpoint
    file gets no part of them, and the set plans as approved."""
    host = host_of(host_name)
    ws.endpoint("big", 'instances = "auto"\nplacement = "host"\n')
    first = ws.plan(host)["big"].plan
    assert first is not None and {m.socket for m in _members(first)} == {0, 1}
    ws.endpoint("new", "")
    approved = {"big": first}
    results = ws.plan(host, reservations=Reservations.of(approved))
    again = results["big"].plan
    assert again is not None and again.units == first.units
    assert results["new"].plan is None
    assert any(
        "no socket or NUMA node left" in e.text and "held by big" in e.text
        for e in results["new"].errors
    ), results["new"].errors


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('extra_args = ["--data-parallel-size", "2"]\n', "extra_args[0]"),
        ('extra_args = ["--dp-size=2"]\n', "extra_args[0]"),
        ('[env]\nVLLM_DP_SIZE = "2"\n', "env.VLLM_DP_SIZE"),
    ],
)
def test_vllm_data_parallel_is_refused_pointing_at_instances(
    ws: PlanWorkspace, host_of: HostOf, text: str, key: str
) -> None:
    ws.endpoint("dp", text)
    result = ws.plan(host_of("genoa-9654-2s-nps1"))["dp"]
    assert result.plan is None and result.exit_code == 2
    [error] = result.errors
    assert error.key == key
    assert "47328" in error.text and "instances = N" in error.text


def test_the_boot_check_covers_every_socket_of_a_set(ws: PlanWorkspace, host_of: HostOf) -> None:
    """The approval check (ExecCondition of every unit) compares each socket the set uses,
    with the memory of the instances there."""
    host = host_of("genoa-9654-2s-nps1")
    plan = _plan(ws, host, 'instances = "auto"\nplacement = "host"\n')
    needs = socket_needs(plan)
    assert sorted(needs) == [0, 1]
    per_socket = [
        sum(m.memory.required_gb for m in _members(plan) if m.socket == s) for s in (0, 1)
    ]
    assert [needs[0], needs[1]] == per_socket
    single = _plan(ws, host, "", name="one")
    one = cpu(single)
    assert socket_needs(single) == {one.socket: one.memory.required_gb}
