"""Which AMD Instinct GPUs, tensor-parallel size and CPUs each GPU endpoint gets
(docs/instinct.md), before the CPU endpoints are placed on what is left.

- GPUs: the file's list, else free GPUs of one kind (gfx and VRAM), one socket's first.
  GPUs held by other endpoints (approved or planned in this round) are never shared.
- Tensor-parallel size: the file's, else the smallest power of two whose VRAM holds the
  model with the recipe's overhead and KV margin (`epycd.model.gpu_memory`).
- CPUs: the NUMA nodes of the chosen GPUs, all their threads; GPU endpoints whose GPUs sit
  on one node split its cores. CPU endpoints are then placed on the other nodes only
  (`cpu_host_view`), so no core is shared between a GPU and a CPU endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from epycd.errors import EpycError, InputError, Refusal
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import GpuFacts, HostFacts
from epycd.model.gpu_memory import GpuFit, fit_vram, launchable, smallest_fitting_tp
from epycd.model.instinct import InstinctGpus
from epycd.sizes import GIB


@dataclass(frozen=True)
class GpuRequest:
    name: str
    file: Path
    model: str
    gpus: list[int] | None
    """The file's GPU list, or None for "auto"."""
    tensor_parallel_size: int | None
    weights_bytes: int
    kept: list[int] | None = None
    """The GPUs of the endpoint's approved plan: kept while free and still fitting."""


class GpuPlacement(BaseModel):
    gpus: list[int]
    gfx_version: str
    product: str
    fit: GpuFit
    numa_nodes: list[int]
    socket: int
    cpus: list[int] = Field(default_factory=list, description="every thread of its share")
    reason: str
    warnings: list[str] = Field(default_factory=list)
    confirmation_reasons: list[str] = Field(default_factory=list)


QUANTIZED_FIX = (
    "choose a quantized variant (the recipe's fp8/mxfp4 variant, the provider's -FP8/AWQ/GPTQ "
    "checkpoint, or AMD Quark's amd/<model> on Hugging Face) or a smaller model"
)


def _kind(gpu: GpuFacts) -> tuple[str, float]:
    return gpu.gfx_version, gpu.vram_gb


def _fit_text(request: GpuRequest, gpu: GpuFacts, fit: GpuFit) -> str:
    return (
        f"{request.model} ({request.weights_bytes / GIB:.1f} GiB of weights) with tensor "
        f"parallel size {fit.tensor_parallel_size} puts {fit.weights_gb:g} GiB on each "
        f"{gpu.product} ({gpu.vram_gb:g} GiB), {fit.remaining_for_kv_gb:g} GiB left for the "
        f"KV cache after {fit.overhead_gb:g} GiB overhead"
    )


def _decide_tp(
    request: GpuRequest, kind: list[GpuFacts], free: int, data: InstinctGpus
) -> GpuFit | EpycError:
    """The fit for the file's TP or the smallest fitting power of two within `free` GPUs."""
    gpu = kind[0]
    sizes = [tp for tp in data.tensor_parallel_sizes if tp <= len(kind)]
    if request.tensor_parallel_size is not None:
        fit = fit_vram(request.weights_bytes, gpu.vram_gb, request.tensor_parallel_size, data.fit)
        if launchable(fit):
            return fit
        better = smallest_fitting_tp(request.weights_bytes, gpu.vram_gb, sizes, data.fit)
        return Refusal(
            f"{_fit_text(request, gpu, fit)}: below the {data.fit.min_kv_gb:g} GiB the recipe "
            "needs",
            file=request.file,
            key="tensor_parallel_size",
            fix=f"set tensor_parallel_size = {better.tensor_parallel_size}"
            if better
            else QUANTIZED_FIX,
        )
    best = smallest_fitting_tp(request.weights_bytes, gpu.vram_gb, sizes, data.fit)
    if best is None:
        largest = fit_vram(request.weights_bytes, gpu.vram_gb, max(sizes), data.fit)
        return Refusal(
            f"too big for all {len(kind)} {gpu.product} GPU(s): {_fit_text(request, gpu, largest)}",
            file=request.file,
            key="model",
            fix=QUANTIZED_FIX,
        )
    if best.tensor_parallel_size > free:
        return Refusal(
            f"needs tensor parallel size {best.tensor_parallel_size}, and only {free} "
            f"{gpu.product} GPU(s) are free (the others serve other endpoints)",
            file=request.file,
            key="gpus",
            fix="remove an endpoint that holds GPUs, or choose a smaller model",
        )
    return best


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
    request: GpuRequest, host: HostFacts, taken: Mapping[int, str], data: InstinctGpus
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
    tp = request.tensor_parallel_size
    if len(chosen) not in data.tensor_parallel_sizes or tp not in (None, len(chosen)):
        return InputError(
            f"{len(chosen)} GPU(s) listed: the tensor parallel size is the number of GPUs, "
            f"one of {', '.join(map(str, data.tensor_parallel_sizes))}",
            file=request.file,
            key="gpus",
            fix="list 1, 2, 4 or 8 GPUs, and leave tensor_parallel_size at that number or auto",
        )
    return chosen


def _place_one(
    request: GpuRequest,
    host: HostFacts,
    taken: Mapping[int, str],
    data: InstinctGpus,
) -> tuple[list[GpuFacts], GpuFit, str] | EpycError:
    socket_of = {n: s.socket for s in host.socket_topology for n in s.numa_nodes}
    if request.gpus is not None:
        chosen = _explicit(request, host, taken, data)
        if isinstance(chosen, EpycError):
            return chosen
        kind = [gpu for gpu in host.gpus if _kind(gpu) == _kind(chosen[0])]
        fit = _decide_tp(_with_tp(request, len(chosen)), kind, len(chosen), data)
        return fit if isinstance(fit, EpycError) else (chosen, fit, "forced by gpus")
    free = [gpu for gpu in host.gpus if gpu.index not in taken]
    kind_key = _kind(free[0] if free else host.gpus[0])
    kind = [gpu for gpu in host.gpus if _kind(gpu) == kind_key]
    free = [gpu for gpu in free if _kind(gpu) == kind_key]
    kept = [gpu for gpu in free if request.kept and gpu.index in request.kept]
    if request.kept and len(kept) == len(request.kept):
        fit = fit_vram(request.weights_bytes, kept[0].vram_gb, len(kept), data.fit)
        if launchable(fit) and request.tensor_parallel_size in (None, len(kept)):
            return kept, fit, "kept from its approved plan"
    fit_or_error = _decide_tp(request, kind, len(free), data)
    if isinstance(fit_or_error, EpycError):
        return fit_or_error
    chosen = _pick(free, fit_or_error.tensor_parallel_size, socket_of)
    return chosen, fit_or_error, "the first free GPUs of one kind, one socket's first"


def _with_tp(request: GpuRequest, tp: int) -> GpuRequest:
    return GpuRequest(
        request.name, request.file, request.model, request.gpus, tp, request.weights_bytes
    )


def no_gpu_refusal(request: GpuRequest) -> Refusal:
    return Refusal(
        "no AMD GPU on this host (no GPU node in sys/class/kfd/kfd/topology)",
        file=request.file,
        key="device",
        fix='load the amdgpu driver (lsmod | grep amdgpu) and install ROCm, or set device = "cpu"',
    )


def _placement(
    host: HostFacts, chosen: list[GpuFacts], fit: GpuFit, reason: str, data: InstinctGpus
) -> GpuPlacement:
    gpu = chosen[0]
    warnings, reasons = [], []
    nodes = sorted({g.numa_node for g in chosen if g.numa_node is not None})
    if len(nodes) < len({g.numa_node for g in chosen}):
        warnings.append("the NUMA node of some GPUs is unknown: CPUs pinned to the known ones")
    if not nodes:
        nodes = sorted(host.socket_topology[0].numa_nodes)
        warnings.append(f"the GPUs' NUMA nodes are unknown: pinned to socket 0's nodes {nodes}")
    if gpu.gfx_version not in data.validated_gfx:
        reasons.append(f"{gpu.product} is {gpu.gfx_version}: {data.unvalidated_note}")
    if fit.tier == "tight":
        warnings.append(
            f"only {fit.remaining_for_kv_gb:g} GiB per GPU is left for the KV cache (under "
            f"{data.fit.safe_kv_gb:g}): started with --enforce-eager, as HIP graph capture "
            "could run out of memory"
        )
    socket = next(s.socket for s in host.socket_topology if nodes[0] in s.numa_nodes)
    return GpuPlacement(
        gpus=[g.index for g in chosen],
        gfx_version=gpu.gfx_version,
        product=gpu.product,
        fit=fit,
        numa_nodes=nodes,
        socket=socket,
        reason=reason,
        warnings=warnings,
        confirmation_reasons=reasons,
    )


def place_gpus(
    requests: Sequence[GpuRequest],
    host: HostFacts,
    data: InstinctGpus,
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
        placed = _place_one(request, host, taken, data)
        if isinstance(placed, EpycError):
            results[request.name] = placed
            continue
        chosen, fit, reason = placed
        taken |= {gpu.index: request.name for gpu in chosen}
        results[request.name] = _placement(host, chosen, fit, reason, data)
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
