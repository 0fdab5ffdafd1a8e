"""Sockets assembled from CPU places and NUMA nodes.

Which socket a node belongs to:
- a node with CPUs belongs to the package(s) its CPUs sit on (a node spanning packages,
  as the one-node fallback of a NUMA-less multi-socket host does, belongs to each, with a
  warning: it is the only node either socket can bind memory to);
- a node without CPUs (CXL or other memory-only node) belongs to the socket of the
  nearest node that has CPUs, by the node's `distance` row (ties: the lower node); without
  distances it belongs to no socket and a warning says so.
NPS counts the socket's nodes that have CPUs there, memory-less ones included; memory-only
nodes add memory and a node number, not an NPS step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from epycd.host.cpulist import format_cpulist
from epycd.host.facts import NumaNode, SocketTopology
from epycd.host.topology import Core, CpuPlace, l3_groups
from epycd.sizes import gib


def _nearest_cpu_node(node: NumaNode, nodes: Sequence[NumaNode]) -> NumaNode | None:
    if len(node.distances) != len(nodes):
        return None
    candidates = [
        (distance, other.node, other)
        for distance, other in zip(node.distances, nodes, strict=True)
        if other.cpus and other.node != node.node
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda item: (item[0], item[1]))[2]


def node_packages(
    nodes: Sequence[NumaNode], package_of: dict[int, int], warnings: list[str]
) -> dict[int, list[int]]:
    """Node -> the packages it is attributed to (empty: none)."""
    owners: dict[int, list[int]] = {}
    for node in nodes:
        if node.cpus:
            packages = sorted({package_of[cpu] for cpu in node.cpus if cpu in package_of})
            if len(packages) > 1:
                warnings.append(f"NUMA node {node.node} spans sockets {packages}")
            owners[node.node] = packages
    for node in nodes:
        if node.cpus:
            continue
        nearest = _nearest_cpu_node(node, nodes)
        if nearest is None:
            owners[node.node] = []
            warnings.append(f"NUMA node {node.node} has no CPUs and no usable distances: no socket")
        else:
            owners[node.node] = list(owners[nearest.node])
            warnings.append(
                f"NUMA node {node.node} has no CPUs: counted with socket(s) "
                f"{owners[nearest.node]} (nearest node {nearest.node})"
            )
    return owners


def build_sockets(
    places: Sequence[CpuPlace],
    cores: Sequence[Core],
    nodes: Sequence[NumaNode],
    warnings: list[str],
) -> list[SocketTopology]:
    package_of = {place.cpu: place.package for place in places}
    owners = node_packages(nodes, package_of, warnings)
    nodes_of: dict[int, list[NumaNode]] = defaultdict(list)
    for node in nodes:
        for package in owners[node.node]:
            nodes_of[package].append(node)
    sockets = []
    for package in sorted({place.package for place in places}):
        members = [place for place in places if place.package == package]
        own_cores = [core for core in cores if core.package == package]
        own_nodes = sorted(nodes_of[package], key=lambda node: node.node)
        cpu_nodes = [n for n in own_nodes if any(package_of.get(c) == package for c in n.cpus)]
        sockets.append(
            SocketTopology(
                socket=package,
                physical_cpus=format_cpulist(core.first for core in own_cores),
                logical_cpus=format_cpulist(place.cpu for place in members),
                numa_nodes=[node.node for node in own_nodes],
                memory_gb=gib(sum(node.memory_total_bytes for node in own_nodes)),
                memory_available_gb=gib(sum(node.memory_available_bytes for node in own_nodes)),
                physical_cores=len(own_cores),
                smt_siblings={core.first: list(core.threads[1:]) for core in own_cores},
                l3_groups=l3_groups(members),
                nps=max(1, len(cpu_nodes)),
            )
        )
    return sockets
