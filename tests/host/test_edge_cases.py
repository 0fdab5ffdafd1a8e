"""Offline CPUs, gaps, missing folders, memory-less and memory-only nodes, bad files."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from epycd.errors import InputError
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from tests.host import expect
from tests.hosts import CATALOGUE, ZEN4_FLAGS, HostShape, MemoryOnlyNode, make_host, write_host

SMALL = HostShape(
    cpu_name="AMD EPYC 9124 16-Core Processor",
    family=25,
    model=17,
    flags=ZEN4_FLAGS,
    sockets=2,
    cores_per_socket=4,
    threads_per_core=2,
    node_memory_gib=32.0,
    l3_cores=4,
)


def detect(root: Path) -> HostFacts:
    return detect_host(root, probe_runtimes=False)


def check_against_shape(facts: HostFacts, shape: HostShape) -> None:
    for sock in facts.socket_topology:
        assert sock.physical_cpus == expect.cpulist(expect.physical_cpus(shape, sock.socket))
        assert sock.logical_cpus == expect.cpulist(expect.logical_cpus(shape, sock.socket))
        assert sock.numa_nodes == expect.socket_nodes(shape, sock.socket)
        assert sock.memory_gb == expect.socket_memory_gib(shape, sock.socket)


def test_offline_cpu_vm(tmp_path: Path) -> None:
    facts = detect(make_host(tmp_path, "vm-offline-cpu"))
    assert facts.offline_cpus == "2"
    assert facts.logical_cores == 3
    assert facts.socket(0).physical_cpus == "0-1,3"
    assert 2 not in facts.node(0).cpus


def test_offline_first_thread_leaves_its_sibling_as_the_physical_cpu(tmp_path: Path) -> None:
    shape = replace(SMALL, offline_cpus=frozenset({0, 13}))
    facts = detect(write_host(tmp_path, shape))
    check_against_shape(facts, shape)
    # core 0 of socket 0 is CPUs 0 and 8: with 0 offline, 8 stands for it
    assert facts.socket(0).physical_cpus == "1-3,8"
    assert facts.socket(0).smt_siblings[8] == []
    assert facts.socket(1).logical_cpus == "4-7,12,14-15"
    assert facts.offline_cpus == "0,13"
    assert facts.physical_cores == 8


def test_cpu_numbers_with_gaps(tmp_path: Path) -> None:
    shape = replace(SMALL, missing_cpu_numbers=frozenset({4, 5, 6, 7}))
    facts = detect(write_host(tmp_path, shape))
    check_against_shape(facts, shape)
    assert facts.socket(0).physical_cpus == "0-3"
    assert facts.socket(1).physical_cpus == "8-11"
    assert facts.socket(1).logical_cpus == "8-11,16-19"
    assert facts.logical_cores == 16


def test_no_node_folder_single_socket(tmp_path: Path) -> None:
    shape = replace(CATALOGUE["this-machine-genoa-vm"], node_dir=False)
    facts = detect(write_host(tmp_path, shape))
    assert [n.node for n in facts.nodes] == [0]
    assert facts.node(0).cpus == [0, 1]
    assert facts.socket(0).numa_nodes == [0]
    # one node holding /proc/meminfo's memory
    assert facts.socket(0).memory_gb == facts.memory_gb == 23.5
    assert facts.warnings == []


def test_no_node_folder_two_sockets_share_node_zero(tmp_path: Path) -> None:
    shape = replace(SMALL, node_dir=False)
    facts = detect(write_host(tmp_path, shape))
    assert facts.socket(0).numa_nodes == facts.socket(1).numa_nodes == [0]
    assert facts.socket(1).physical_cpus == "4-7"
    assert any("spans sockets" in w for w in facts.warnings)


def test_memoryless_node_with_cpus(tmp_path: Path) -> None:
    shape = replace(SMALL, nps=2, memoryless_nodes=frozenset({1}))
    facts = detect(write_host(tmp_path, shape))
    check_against_shape(facts, shape)
    assert facts.node(1).memory_total_bytes == 0
    assert facts.node(1).cpus == [2, 3, 10, 11]
    assert facts.socket(0).numa_nodes == [0, 1]
    assert facts.socket(0).nps == 2
    assert facts.socket(0).memory_gb == 32.0
    assert facts.socket(1).memory_gb == 64.0


def test_memory_only_node_joins_the_nearest_socket(tmp_path: Path) -> None:
    shape = replace(SMALL, memory_only_nodes=(MemoryOnlyNode(near_socket=1, memory_gib=256.0),))
    facts = detect(write_host(tmp_path, shape))
    check_against_shape(facts, shape)
    assert facts.node(2).cpus == []
    assert facts.socket(1).numa_nodes == [1, 2]
    assert facts.socket(1).memory_gb == 32.0 + 256.0
    assert facts.socket(1).nps == 1
    assert facts.socket(0).numa_nodes == [0]
    assert any("node 2 has no CPUs" in w for w in facts.warnings)


def test_memory_only_node_without_distances_joins_no_socket(tmp_path: Path) -> None:
    shape = replace(SMALL, memory_only_nodes=(MemoryOnlyNode(near_socket=0, memory_gib=64.0),))
    root = write_host(tmp_path, shape)
    (root / "sys/devices/system/node/node2/distance").unlink()
    facts = detect(root)
    assert facts.socket(0).numa_nodes == [0]
    assert facts.socket(1).numa_nodes == [1]
    assert facts.numa_nodes == 3
    assert any("no socket" in w for w in facts.warnings)


def test_nps4_with_smt_off(tmp_path: Path) -> None:
    shape = replace(CATALOGUE["genoa-9654-2s-nps4"], threads_per_core=1)
    facts = detect(write_host(tmp_path, shape))
    check_against_shape(facts, shape)
    assert facts.threads_per_core == 1
    assert facts.node(5).cpus == list(range(120, 144))


@pytest.mark.parametrize(
    "relative", ["proc/cpuinfo", "proc/meminfo", "sys/devices/system/cpu/online"]
)
def test_missing_required_file_names_it(tmp_path: Path, relative: str) -> None:
    root = make_host(tmp_path, "vm-zen5")
    (root / relative).unlink()
    with pytest.raises(InputError) as caught:
        detect(root)
    assert str(root / relative) in str(caught.value)
    assert "missing" in str(caught.value)


def test_unreadable_required_file_names_it(tmp_path: Path) -> None:
    root = make_host(tmp_path, "vm-zen5")
    (root / "proc/meminfo").unlink()
    (root / "proc/meminfo").mkdir()
    with pytest.raises(InputError) as caught:
        detect(root)
    assert str(root / "proc/meminfo") in str(caught.value)
    assert "unreadable" in str(caught.value)


@pytest.mark.parametrize(
    ("relative", "text"),
    [
        ("sys/devices/system/cpu/online", "zero to three\n"),
        ("proc/meminfo", "MemFree: 12 kB\n"),
        ("proc/cpuinfo", "nothing here\n"),
        ("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: lots kB\n"),
    ],
)
def test_malformed_file_names_it(tmp_path: Path, relative: str, text: str) -> None:
    root = make_host(tmp_path, "vm-zen5")
    (root / relative).write_text(text)
    with pytest.raises(InputError) as caught:
        detect(root)
    assert str(root / relative) in str(caught.value)


def test_empty_root_names_cpuinfo(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="proc/cpuinfo"):
        detect(tmp_path)


def test_without_sysfs_topology_cpuinfo_places_cpus(tmp_path: Path) -> None:
    root = write_host(tmp_path, SMALL)
    for cpu_dir in (root / "sys/devices/system/cpu").glob("cpu[0-9]*"):
        shutil.rmtree(cpu_dir / "topology")
        shutil.rmtree(cpu_dir / "cache")
    facts = detect(root)
    check_against_shape(facts, SMALL)
    assert facts.socket(0).l3_groups == []
    assert any("no sysfs topology" in w for w in facts.warnings)


def test_without_core_id_thread_siblings_group_cores(tmp_path: Path) -> None:
    root = write_host(tmp_path, SMALL)
    for core_id in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology/core_id"):
        core_id.unlink()
    facts = detect(root)
    check_against_shape(facts, SMALL)
    assert facts.socket(1).smt_siblings[4] == [12]


def test_missing_optional_node_files(tmp_path: Path) -> None:
    shape = replace(SMALL, nps=2)
    root = write_host(tmp_path, shape)
    node_dir = root / "sys/devices/system/node"
    (node_dir / "online").unlink()
    (node_dir / "node3/meminfo").unlink()
    (root / "sys/devices/system/cpu/offline").unlink()
    facts = detect(root)
    assert [n.node for n in facts.nodes] == [0, 1, 2, 3]
    assert facts.node(3).memory_total_bytes == 0
    assert facts.socket(1).memory_gb == 32.0
    assert facts.offline_cpus == ""
    assert any("node3/meminfo" in w for w in facts.warnings)


def test_core_id_repeating_across_dies_does_not_merge_cores(tmp_path: Path) -> None:
    """Cores are grouped by thread_siblings_list, not by a core_id that may repeat."""
    root = write_host(tmp_path, SMALL)
    for core_id in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology/core_id"):
        core_id.write_text(f"{int(core_id.read_text()) % 2}\n")
    facts = detect(root)
    check_against_shape(facts, SMALL)
    assert facts.physical_cores == 8
    assert facts.socket(0).smt_siblings == {0: [8], 1: [9], 2: [10], 3: [11]}


def test_without_thread_siblings_core_id_groups_cores(tmp_path: Path) -> None:
    root = write_host(tmp_path, SMALL)
    for siblings in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_*"):
        siblings.unlink()
    facts = detect(root)
    check_against_shape(facts, SMALL)
    assert facts.socket(1).smt_siblings[4] == [12]
    assert facts.warnings == []
