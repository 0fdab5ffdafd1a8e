"""Every catalogue host: per-socket CPU lists, nodes and memory as the shape says."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from tests.host import expect
from tests.hosts import CATALOGUE, HostShape, make_host


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HostFacts]:
    base = tmp_path_factory.mktemp("hosts")
    return {name: detect_host(make_host(base, name), probe_runtimes=False) for name in CATALOGUE}


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_sockets_cpus_nodes_memory(hosts: dict[str, HostFacts], name: str) -> None:
    shape = CATALOGUE[name]
    facts = hosts[name]
    assert [s.socket for s in facts.socket_topology] == list(range(shape.sockets))
    for sock in facts.socket_topology:
        s = sock.socket
        assert sock.physical_cpus == expect.cpulist(expect.physical_cpus(shape, s))
        assert sock.logical_cpus == expect.cpulist(expect.logical_cpus(shape, s))
        assert sock.physical_cores == len(expect.physical_cpus(shape, s))
        assert sock.numa_nodes == expect.socket_nodes(shape, s)
        assert sock.nps == shape.nps
        assert sock.memory_gb == expect.socket_memory_gib(shape, s)
        assert sock.memory_available_gb == expect.socket_available_gib(shape, s)
        numbers = expect.cpu_numbers(shape)
        cores = [expect.core_threads(shape, s, c, numbers) for c in range(shape.cores_per_socket)]
        assert sock.smt_siblings == {t[0]: t[1:] for t in cores if t}
        expected_l3 = (shape.cores_per_socket + shape.l3_cores - 1) // shape.l3_cores
        assert len(sock.l3_groups) == expected_l3


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_host_totals(hosts: dict[str, HostFacts], name: str) -> None:
    shape = CATALOGUE[name]
    facts = hosts[name]
    online = shape.sockets * shape.cores_per_socket * shape.threads_per_core
    online -= len(shape.offline_cpus)
    assert facts.logical_cores == online
    physical = sum(len(expect.physical_cpus(shape, s)) for s in range(shape.sockets))
    assert facts.physical_cores == physical
    assert facts.sockets == shape.sockets
    assert facts.threads_per_core == shape.threads_per_core
    assert facts.numa_nodes == shape.sockets * shape.nps
    assert facts.memory_gb == round(expect.host_memtotal_kib(shape) / expect.GIB_KIB, 2)
    assert facts.cpu_model == shape.cpu_name
    assert facts.vendor == shape.vendor
    assert (facts.cpu_family, facts.cpu_model_number) == (shape.family, shape.model)
    for node in facts.nodes:
        assert node.memory_total_bytes == expect.node_total_kib(shape, node.node) * 1024
        assert node.memory_available_bytes == expect.node_available_kib(shape, node.node) * 1024
    assert facts.warnings == []


# name -> (generation, zen, supported, avx512, avx512_bf16, is_amd_epyc)
IDENTITY = {
    "vm-zen5": ("Turin", "Zen 5", True, True, True, True),
    "vm-zen5-24g": ("Turin", "Zen 5", True, True, True, True),
    "this-machine-genoa-vm": ("Genoa", "Zen 4", True, True, True, True),
    "genoa-9654-2s-nps1": ("Genoa", "Zen 4", True, True, True, True),
    "genoa-9654-2s-nps4": ("Genoa", "Zen 4", True, True, True, True),
    "milan-7763-2s": ("Milan", "Zen 3", False, False, False, True),
    "bergamo-9754": ("Bergamo", "Zen 4c", False, True, True, True),
    "epyc-4584px": ("EPYC 4004", "Zen 4", False, True, True, True),
    "turin-9965": ("Turin", "Zen 5c", True, True, True, True),
    "turin-9965-2s-nosmt": ("Turin", "Zen 5c", True, True, True, True),
    "venice-256c": ("Venice", "Zen 6", True, True, True, True),
    "xeon": ("unknown", None, False, True, True, False),
    "vm-offline-cpu": ("Genoa", "Zen 4", True, True, True, True),
    "bench-2s-512t": ("Turin", "Zen 5", True, True, True, True),
    "genoa-2s-8x-mi300x": ("Genoa", "Zen 4", True, True, True, True),
    "turin-2s-8x-mi355x": ("Turin", "Zen 5", True, True, True, True),
    "genoa-1x-mi210": ("Genoa", "Zen 4", True, True, True, True),
    "turin-9755-2s-nosmt": ("Turin", "Zen 5", True, True, True, True),
    "vm-16": ("Genoa", "Zen 4", True, True, True, True),
}


def test_identity_table_covers_catalogue() -> None:
    assert set(IDENTITY) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(IDENTITY))
def test_identity(hosts: dict[str, HostFacts], name: str) -> None:
    facts = hosts[name]
    got = (
        facts.epyc_generation,
        facts.zen_arch,
        facts.is_supported_epyc,
        facts.avx512,
        facts.avx512_bf16,
        facts.is_amd_epyc,
    )
    assert got == IDENTITY[name]


def test_nps4_nodes_split_each_socket_in_four(hosts: dict[str, HostFacts]) -> None:
    facts = hosts["genoa-9654-2s-nps4"]
    assert facts.socket(0).numa_nodes == [0, 1, 2, 3]
    assert facts.socket(1).numa_nodes == [4, 5, 6, 7]
    # 24 cores x 2 threads per node; node 1 = cores 24-47 of socket 0 and their siblings
    assert facts.node(1).cpus == [*range(24, 48), *range(216, 240)]
    assert facts.socket(0).memory_gb == 384.0


def test_venice_has_1024_threads(hosts: dict[str, HostFacts]) -> None:
    facts = hosts["venice-256c"]
    assert facts.logical_cores == 1024
    assert facts.socket(1).physical_cpus == "256-511"
    assert facts.socket(1).logical_cpus == "256-511,768-1023"


def test_genoa_nps1_literal_lists(hosts: dict[str, HostFacts]) -> None:
    """The linux numbering spelled out once by hand, besides the derived checks."""
    facts = hosts["genoa-9654-2s-nps1"]
    assert facts.socket(0).physical_cpus == "0-95"
    assert facts.socket(0).logical_cpus == "0-95,192-287"
    assert facts.socket(1).physical_cpus == "96-191"
    assert facts.socket(1).smt_siblings[96] == [288]
    assert facts.socket(0).l3_groups[0] == "0-7,192-199"


def test_write_host_is_reproducible(tmp_path: Path) -> None:
    shape: HostShape = CATALOGUE["epyc-4584px"]
    first = detect_host(make_host(tmp_path / "a", "epyc-4584px"), probe_runtimes=False)
    second = detect_host(make_host(tmp_path / "b", "epyc-4584px"), probe_runtimes=False)
    assert first == second
    assert first.physical_cores == shape.cores_per_socket
