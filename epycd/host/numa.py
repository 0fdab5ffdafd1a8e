"""NUMA nodes from `sys/devices/system/node/`: CPUs, memory and distances per node.

With no node folder (kernels without NUMA, some containers) the host is one node 0 that
holds every online CPU and the memory of `/proc/meminfo`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import NumaNode
from epycd.host.files import parsed, read_optional
from epycd.host.memory import Memory, memory_of, parse_meminfo

NODE_DIR = "sys/devices/system/node"
_NODE_NAME = re.compile(r"node(\d+)")


def node_numbers(root: Path) -> list[int] | None:
    """Online nodes, or None when the host has no node folder at all."""
    node_dir = root / NODE_DIR
    if not node_dir.is_dir():
        return None
    text = read_optional(root, f"{NODE_DIR}/online")
    if text is not None and text.strip():
        return parsed(root, f"{NODE_DIR}/online", text, parse_cpulist)
    numbers = []
    for entry in node_dir.iterdir():
        match = _NODE_NAME.fullmatch(entry.name)
        if match and entry.is_dir():
            numbers.append(int(match.group(1)))
    return sorted(numbers) or None


def _node_memory(root: Path, node: int, warnings: list[str]) -> Memory:
    relative = f"{NODE_DIR}/node{node}/meminfo"
    text = read_optional(root, relative)
    if text is None:
        warnings.append(f"{root / relative} missing: node {node} counted with no memory")
        return Memory(0, 0)
    return memory_of(parsed(root, relative, text, parse_meminfo))


def _distances(root: Path, node: int) -> list[int]:
    text = read_optional(root, f"{NODE_DIR}/node{node}/distance")
    if text is None:
        return []
    try:
        return [int(word) for word in text.split()]
    except ValueError:
        return []


def read_nodes(
    root: Path, online: Iterable[int], host_memory: Memory, warnings: list[str]
) -> list[NumaNode]:
    online_set = set(online)
    numbers = node_numbers(root)
    if numbers is None:
        return [
            NumaNode(
                node=0,
                cpus=sorted(online_set),
                memory_total_bytes=host_memory.total_bytes,
                memory_available_bytes=host_memory.available_bytes,
                distances=[10],
            )
        ]
    nodes = []
    for node in numbers:
        relative = f"{NODE_DIR}/node{node}/cpulist"
        text = read_optional(root, relative)
        cpus = parsed(root, relative, text, parse_cpulist) if text is not None else []
        memory = _node_memory(root, node, warnings)
        nodes.append(
            NumaNode(
                node=node,
                cpus=[cpu for cpu in cpus if cpu in online_set],
                memory_total_bytes=memory.total_bytes,
                memory_available_bytes=memory.available_bytes,
                distances=_distances(root, node),
            )
        )
    homeless = online_set.difference(*(node.cpus for node in nodes))
    if homeless:
        warnings.append(
            f"online CPUs {sorted(homeless)} are in no NUMA node's cpulist; "
            f"counted in node {nodes[0].node}"
        )
        nodes[0] = nodes[0].model_copy(update={"cpus": sorted({*nodes[0].cpus, *homeless})})
    return nodes
