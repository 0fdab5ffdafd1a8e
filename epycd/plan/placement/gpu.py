"""Which AMD Instinct GPUs and CPUs each GPU endpoint gets (docs/instinct.md), before the
CPU endpoints are placed on what is left.

- GPUs: the file's list, else free GPUs of one kind (gfx and VRAM), one socket's first.
  GPUs held by other endpoints (approved or planned in this round) are never shared.
- How many: the endpoint's engine sizes it (`GpuSizer`): the GPU count its model needs on
  that kind, and the fit behind it, or the refusal.
- CPUs: the NUMA nodes of the chosen GPUs, all their threads; GPU endpoints whose GPUs sit
  on one node split its cores. CPU endpoints are then placed on the other nodes only
  (`cpu_host_view`), so no core is shared between a GPU and a CPU endpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from epycd.errors import EpycError, InputError, Refusal
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import GpuFacts, HostFacts


class GpuSizing(BaseModel):
    """An engine's answer for one endpoint on GPUs of one kind: how many it spans, the fit
    behind that count (the engine's own type, handed back to it to decide), and what the
    admin should hear of it."""

    count: int
    fit: BaseModel
    warnings: list[str] = Field(default_factory=list)
    confirmation_reasons: list[str] = Field(default_factory=list)


class GpuSizer(ABC):
    """One endpoint's engine sizing it on GPUs (`EnginePlanner.gpu_sizer`). `kind`: every
    GPU of the host of one kind (gfx and VRAM), the first of them the kind's facts."""

    @abstractmethod
    def on(self, kind: Sequence[GpuFacts], count: int) -> GpuSizing | EpycError:
        """The sizing on exactly `count` GPUs of the kind (the file lists them, or the
        approved plan held them), or why it cannot span that many."""

    @abstractmethod
    def smallest(self, kind: Sequence[GpuFacts], free: int) -> GpuSizing | EpycError:
        """The fewest GPUs of the kind that hold the model, at most `free`, or the refusal."""


@dataclass(frozen=True)
class GpuRequest:
    name: str
    file: Path
    gpus: list[int] | None
    """The file's GPU list, or None for "auto"."""
    sizer: GpuSizer
    kept: list[int] | None = None
    """The GPUs of the endpoint's approved plan: kept while free and still fitting."""


class GpuPlacement(BaseModel):
    gpus: list[int]
    gfx_version: str
    product: str
    fit: BaseModel = Field(description="its engine's fit on these GPUs (`GpuSizing.fit`)")
    numa_nodes: list[int]
    socket: int
    cpus: list[int] = Field(default_factory=list, description="every thread of its share")
    reason: str
    warnings: list[str] = Field(default_factory=list)
    confirmation_reasons: list[str] = Field(default_factory=list)


def _kind(gpu: GpuFacts) -> tuple[str, float]:
    return gpu.gfx_version, gpu.vram_gb


def _of_kind(host: HostFacts, gpu: GpuFacts) -> list[GpuFacts]:
    return [other for other in host.gpus if _kind(other) == _kind(gpu)]


def _pick(free: list[GpuFacts], count: int, socket_of: Mapping[int, int]) -> list[GpuFacts]:
    """`count` free GPUs, from one socket when one has enough (lowest socket first)."""
    by_socket: dict[int, list[GpuFacts]] = {}
    for gpu in free:
        by_socket.setdefault(socket_of.get(gpu.numa_node or 0, 0), []).append(gpu)
    for socket in sorted(by_socket):
        if len(by_socket[socket]) >= count:
            return by_socket[socket][:count]
    return free[:count]


def _explicit(
    request: GpuRequest, host: HostFacts, taken: Mapping[int, str]
) -> list[GpuFacts] | EpycError:
    assert request.gpus is not None
    known = {gpu.index: gpu for gpu in host.gpus}
    missing = [index for index in request.gpus if index not in known]
    if missing:
        return InputError(
            f"GPU {', '.join(map(str, missing))} does not exist on this host "
            f"(GPUs: {', '.join(map(str, sorted(known))) or 'none'})",
            file=request.file,
            key="gpus",
            fix='choose GPUs that `epycctl detect` lists, or "auto"',
        )
    held = [f"GPU {i} serves {taken[i]}" for i in request.gpus if i in taken]
    if held:
        return Refusal(
            "; ".join(held), file=request.file, key="gpus", fix='choose other GPUs, or "auto"'
        )
    chosen = [known[index] for index in request.gpus]
    if len({_kind(gpu) for gpu in chosen}) > 1:
        return InputError(
            "the GPUs are of different kinds (gfx or VRAM): one instance spans one kind",
            file=request.file,
            key="gpus",
            fix="list GPUs of one kind",
        )
    return chosen


def _place_one(
    request: GpuRequest, host: HostFacts, taken: Mapping[int, str]
) -> tuple[list[GpuFacts], GpuSizing, str] | EpycError:
    socket_of = {n: s.socket for s in host.socket_topology for n in s.numa_nodes}
    if request.gpus is not None:
        chosen = _explicit(request, host, taken)
        if isinstance(chosen, EpycError):
            return chosen
        sized = request.sizer.on(_of_kind(host, chosen[0]), len(chosen))
        return sized if isinstance(sized, EpycError) else (chosen, sized, "forced by gpus")
    free = [gpu for gpu in host.gpus if gpu.index not in taken]
    kind = _of_kind(host, free[0] if free else host.gpus[0])
    free = [gpu for gpu in free if _kind(gpu) == _kind(kind[0])]
    kept = [gpu for gpu in free if request.kept and gpu.index in request.kept]
    if request.kept and len(kept) == len(request.kept):
        sized = request.sizer.on(kind, len(kept))
        if not isinstance(sized, EpycError):
            return kept, sized, "kept from its approved plan"
    sized = request.sizer.smallest(kind, len(free))
    if isinstance(sized, EpycError):
        return sized
    if sized.count > len(free):
        return Refusal(
            f"needs {sized.count} {kind[0].product} GPU(s), and only {len(free)} are free (the "
            "others serve other endpoints)",
            file=request.file,
            key="gpus",
            fix="remove an endpoint that holds GPUs, or choose a smaller model",
        )
    chosen = _pick(free, sized.count, socket_of)
    return chosen, sized, "the first free GPUs of one kind, one socket's first"


def no_gpu_refusal(request: GpuRequest) -> Refusal:
    return Refusal(
        "no AMD GPU on this host (no GPU node in sys/class/kfd/kfd/topology)",
        file=request.file,
        key="device",
        fix='load the amdgpu driver (lsmod | grep amdgpu) and install ROCm, or set device = "cpu"',
    )


def _placement(
    host: HostFacts, chosen: list[GpuFacts], sized: GpuSizing, reason: str
) -> GpuPlacement:
    gpu = chosen[0]
    warnings = []
    nodes = sorted({g.numa_node for g in chosen if g.numa_node is not None})
    if len(nodes) < len({g.numa_node for g in chosen}):
        warnings.append("the NUMA node of some GPUs is unknown: CPUs pinned to the known ones")
    if not nodes:
        nodes = sorted(host.socket_topology[0].numa_nodes)
        warnings.append(f"the GPUs' NUMA nodes are unknown: pinned to socket 0's nodes {nodes}")
    socket = next(s.socket for s in host.socket_topology if nodes[0] in s.numa_nodes)
    return GpuPlacement(
        gpus=[g.index for g in chosen],
        gfx_version=gpu.gfx_version,
        product=gpu.product,
        fit=sized.fit,
        numa_nodes=nodes,
        socket=socket,
        reason=reason,
        warnings=[*warnings, *sized.warnings],
        confirmation_reasons=sized.confirmation_reasons,
    )


def place_gpus(
    requests: Sequence[GpuRequest],
    host: HostFacts,
    held: Mapping[str, list[int]],
) -> dict[str, GpuPlacement | EpycError]:
    """A placement or the error why there is none, for every request; `held`: the GPUs of
    approved endpoints not requested here."""
    taken = {index: name for name, gpus in held.items() for index in gpus}
    results: dict[str, GpuPlacement | EpycError] = {}
    order = sorted(requests, key=lambda r: (r.gpus is None, r.kept is None, r.name))
    for request in order:
        if not host.gpus:
            results[request.name] = no_gpu_refusal(request)
            continue
        placed = _place_one(request, host, taken)
        if isinstance(placed, EpycError):
            results[request.name] = placed
            continue
        chosen, sized, reason = placed
        taken |= {gpu.index: request.name for gpu in chosen}
        results[request.name] = _placement(host, chosen, sized, reason)
    return _share_cpus(host, results)


def _cores(host: HostFacts, node: int) -> list[list[int]]:
    """The node's cores, each as its threads."""
    cpus = set(host.node(node).cpus)
    cores = []
    for sock in host.socket_topology:
        for first in parse_cpulist(sock.physical_cpus):
            if first in cpus:
                cores.append([first, *sock.smt_siblings.get(first, [])])
    return cores


def _share_cpus(
    host: HostFacts, results: dict[str, GpuPlacement | EpycError]
) -> dict[str, GpuPlacement | EpycError]:
    """Each placed endpoint's CPUs: its nodes' cores, split among the endpoints per node."""
    placed = {n: p for n, p in results.items() if isinstance(p, GpuPlacement)}
    users: dict[int, list[str]] = {}
    for name in sorted(placed):
        for node in placed[name].numa_nodes:
            users.setdefault(node, []).append(name)
    cpus: dict[str, list[int]] = {name: [] for name in placed}
    for node, names in users.items():
        cores = _cores(host, node)
        size, extra = divmod(len(cores), len(names))
        start = 0
        for position, name in enumerate(names):
            end = start + size + (1 if position < extra else 0)
            cpus[name] += [cpu for core in cores[start:end] for cpu in core]
            start = end
    for name, placement in placed.items():
        results[name] = placement.model_copy(update={"cpus": sorted(cpus[name])})
    return results


def gpu_nodes(placements: Mapping[str, GpuPlacement | EpycError]) -> set[int]:
    return {n for p in placements.values() if isinstance(p, GpuPlacement) for n in p.numa_nodes}


def cpu_host_view(host: HostFacts, taken_nodes: set[int]) -> HostFacts:
    """The host as CPU endpoints may use it: without the NUMA nodes (and their CPUs) that
    GPU endpoints pin."""
    if not taken_nodes:
        return host
    taken = {cpu for node in host.nodes if node.node in taken_nodes for cpu in node.cpus}
    sockets = [
        sock.model_copy(
            update={
                "numa_nodes": [n for n in sock.numa_nodes if n not in taken_nodes],
                "physical_cpus": _without(sock.physical_cpus, taken),
                "logical_cpus": _without(sock.logical_cpus, taken),
            }
        )
        for sock in host.socket_topology
    ]
    return host.model_copy(update={"socket_topology": sockets})


def _without(cpulist: str, taken: set[int]) -> str:
    return format_cpulist([cpu for cpu in parse_cpulist(cpulist) if cpu not in taken])
