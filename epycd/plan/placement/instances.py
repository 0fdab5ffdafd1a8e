"""One endpoint, many instances (docs/instances.md): how many server instances an endpoint runs, on
which cores and NUMA nodes, and why.

Pure functions of the host's topology, the part of it the endpoint may use (`Region`s: its
allocated socket or node group, and with `placement = "host"` every socket no other endpoint
holds) and a memory check the planner supplies. The rules:

- An instance never spans two sockets, nor two NUMA nodes while there are at least as many
  instances as nodes; with fewer instances than a socket's nodes, one takes whole nodes.
- "auto": one instance per NUMA node on NPS2/NPS4 sockets; on NPS1 sockets AMD's
  multi-instance recipe for EPYC, floor((physical cores - 16) / 32) instances of about 32
  cores per host ("the sweet spot"), spread evenly over the sockets.
- Every instance keeps at least `MIN_AUTO_INSTANCE_CORES` cores under "auto": one for the
  OpenMP threads and one for its front end (docs/tuning.md rule 1, the last core of each
  instance's set). An explicit count may go down to one core per instance; its engine says
  what that costs (`EnginePlanner.layout_warnings`: vLLM's front end then shares the core).
- Instances on one node take whole L3 groups (CCDs) when there are at least as many groups
  as instances, else even runs of consecutive cores.
- Each instance holds its own weights and KV pool: instances sharing a node share its memory
  equally, and "auto" takes fewer instances until each one fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from epycd.errors import InputError
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import HostFacts, SocketTopology

SWEET_SPOT_CORES = 32
"""AMD's multi-instance recipe for EPYC: instances of about 32 cores each."""
HOST_RESERVED_CORES = 16
"""The same recipe's floor((cores - 16) / 32): 16 cores left to the OS and the balancer."""
MIN_AUTO_INSTANCE_CORES = 2
"""An "auto" instance gets its OpenMP core and its front end's core (docs/tuning.md rule 1)."""


@dataclass(frozen=True)
class Region:
    """The part of one socket an endpoint may use: its NUMA nodes with CPUs and the first
    thread of each of their cores."""

    socket: SocketTopology
    nodes: list[int]
    cpus: list[int]


class Slot(BaseModel):
    """Where one instance runs, before sizing and ports."""

    index: int = Field(description="1, 2, ... in socket and CPU order")
    socket: int
    numa_nodes: list[int]
    cpus: list[int] = Field(description="first thread of each of the instance's cores")
    memory_share: float = Field(
        description="the instance's share of its nodes' memory: 1 / instances on those nodes"
    )
    reason: str

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


class Layout(BaseModel):
    """The instances of one endpoint and the reasons for their number and places."""

    requested: int | str = Field(description='the endpoint file\'s instances: N or "auto"')
    slots: list[Slot]
    reasons: list[str]
    warnings: list[str] = Field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.slots)


Fits = Callable[[list[int], float], bool]
"""Whether one instance fits on these NUMA nodes with this share of their memory."""


def region_of(host: HostFacts, socket: int, nodes: list[int], cpus: list[int]) -> Region:
    sock = next(s for s in host.socket_topology if s.socket == socket)
    return Region(sock, list(nodes), sorted(cpus))


def _node_cpus(host: HostFacts, region: Region, node: int) -> list[int]:
    members = set(host.node(node).cpus)
    return [cpu for cpu in region.cpus if cpu in members] if len(region.nodes) > 1 else region.cpus


def _even(count: int, parts: int) -> list[int]:
    """`count` spread over `parts`, the first ones taking the remainder."""
    size, extra = divmod(count, parts)
    return [size + (1 if index < extra else 0) for index in range(parts)]


def _l3_runs(sock: SocketTopology, cpus: list[int], parts: int) -> tuple[list[list[int]], bool]:
    """`cpus` in `parts` runs: whole L3 groups when there are enough, else even runs of
    consecutive cores. (runs, whether they follow L3 groups)"""
    groups: list[list[int]] = []
    wanted = set(cpus)
    for text in sock.l3_groups:
        members = [cpu for cpu in parse_cpulist(text) if cpu in wanted]
        if members:
            groups.append(members)
    if len(groups) >= parts and sum(map(len, groups)) == len(cpus):
        runs, start = [], 0
        for size in _even(len(groups), parts):
            runs.append(sorted(cpu for group in groups[start : start + size] for cpu in group))
            start += size
        return runs, True
    runs, start = [], 0
    for size in _even(len(cpus), parts):
        runs.append(cpus[start : start + size])
        start += size
    return runs, False


def carve(host: HostFacts, region: Region, count: int) -> list[tuple[list[int], list[int], float]]:
    """`count` instances in `region`: (nodes, cpus, memory share) each. Fewer instances than
    nodes take whole nodes; more share each node by L3 groups or runs of cores."""
    if count <= len(region.nodes):
        sizes = _even(len(region.nodes), count)
        out, start = [], 0
        for size in sizes:
            nodes = region.nodes[start : start + size]
            cpus = sorted(cpu for node in nodes for cpu in _node_cpus(host, region, node))
            out.append((nodes, cpus, 1.0))
            start += size
        return out
    carved = []
    for node, share in zip(region.nodes, _even(count, len(region.nodes)), strict=True):
        runs, _ = _l3_runs(region.socket, _node_cpus(host, region, node), share)
        carved += [([node], run, 1.0 / share) for run in runs]
    return carved


def _auto_count(region: Region, regions: int, host_cores: int) -> tuple[int, str]:
    nodes = len(region.nodes)
    if nodes > 1:
        return nodes, (
            f"socket {region.socket.socket}: one per NUMA node ({nodes} nodes, "
            f"NPS{region.socket.nps}): an instance never spans nodes"
        )
    per_host = (host_cores - HOST_RESERVED_CORES) // SWEET_SPOT_CORES
    count = max(1, per_host // regions)
    return count, (
        f"socket {region.socket.socket}: {count}, from AMD's multi-instance recipe: "
        f"floor(({host_cores} cores - {HOST_RESERVED_CORES}) / {SWEET_SPOT_CORES}) = "
        f"{max(per_host, 0)} instance(s) of about {SWEET_SPOT_CORES} cores on "
        f"{regions} socket(s), never across a socket"
    )


def _capped(region: Region, count: int, fits: Fits, host: HostFacts) -> tuple[int, list[str]]:
    """ "auto"'s count cut to the cores (2 per instance) and to the memory."""
    reasons = []
    by_cores = max(1, len(region.cpus) // MIN_AUTO_INSTANCE_CORES)
    if count > by_cores:
        reasons.append(
            f"socket {region.socket.socket}: cut to {by_cores}: {len(region.cpus)} core(s), "
            f"{MIN_AUTO_INSTANCE_CORES} per instance (its OpenMP core and its front end's)"
        )
        count = by_cores
    while count > 1 and not all(fits(n, share) for n, _, share in carve(host, region, count)):
        count -= 1
        reasons.append(
            f"socket {region.socket.socket}: cut to {count}: each instance holds its own "
            f"weights and KV pool, and {count + 1} do not fit in the nodes' memory"
        )
    return count, reasons


def _explicit_counts(requested: int, regions: Sequence[Region], file: str) -> list[int]:
    cores = sum(len(region.cpus) for region in regions)
    if requested > cores:
        raise InputError(
            f"instances = {requested} is more than the {cores} physical core(s) the endpoint "
            "may use: each instance needs at least one core",
            file=file,
            key="instances",
            fix=f'set instances to at most {cores}, or "auto"',
        )
    counts = _even(requested, len(regions))
    for region, count in zip(regions, counts, strict=True):
        if count > len(region.cpus):
            raise InputError(
                f"instances = {requested} puts {count} instances on socket "
                f"{region.socket.socket}, which has {len(region.cpus)} core(s)",
                file=file,
                key="instances",
                fix="set fewer instances",
            )
    return counts


def plan_layout(
    host: HostFacts, regions: Sequence[Region], requested: int | str, fits: Fits, file: str
) -> Layout:
    """The instances of one endpoint in `regions` (sockets in order)."""
    reasons: list[str] = []
    host_cores = sum(len(region.cpus) for region in regions)
    if requested == "auto":
        counts = []
        for region in regions:
            count, why = _auto_count(region, len(regions), host_cores)
            count, cuts = _capped(region, count, fits, host)
            counts.append(count)
            reasons += [why, *cuts]
    else:
        assert isinstance(requested, int)
        counts = _explicit_counts(requested, regions, file)
        reasons.append(f"instances = {requested} in the endpoint file, spread evenly over "
                       f"{len([c for c in counts if c])} socket(s)")  # fmt: skip
    slots: list[Slot] = []
    for region, count in zip(regions, counts, strict=True):
        if count:
            slots += _slots(host, region, count, start=len(slots) + 1)
    return Layout(requested=requested, slots=slots, reasons=reasons)


def _slots(host: HostFacts, region: Region, count: int, start: int) -> list[Slot]:
    carved = carve(host, region, count)
    by_l3 = (
        count > len(region.nodes)
        and _l3_runs(
            region.socket,
            _node_cpus(host, region, region.nodes[0]),
            _even(count, len(region.nodes))[0],
        )[1]
    )
    how = "whole L3 groups" if by_l3 else "consecutive cores"
    slots = []
    for offset, (nodes, cpus, share) in enumerate(carved):
        where = f"socket {region.socket.socket}, NUMA node(s) {format_cpulist(nodes)}"
        if share < 1.0:
            reason = f"{where}: 1 of {round(1 / share)} on the node, {how}"
        else:
            reason = f"{where}: the node(s) to itself"
        slots.append(
            Slot(
                index=start + offset,
                socket=region.socket.socket,
                numa_nodes=nodes,
                cpus=cpus,
                memory_share=share,
                reason=reason,
            )
        )
    return slots
