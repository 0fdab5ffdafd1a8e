"""Instinct GPU endpoints inside `plan_all` (epycd.plan.build): place them first, give the
CPU endpoints the host without their NUMA nodes, and decide each GPU endpoint's plan.
Imported by `build.place_round` when it runs (build is imported here)."""

from __future__ import annotations

from collections.abc import Mapping

from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.model.instinct import shipped_gpus
from epycd.plan.build import plan_result
from epycd.plan.gpu import GpuPlacement, GpuRequest, cpu_host_view, gpu_nodes, place_gpus
from epycd.plan.gpu_decide import decide_gpu
from epycd.plan.prepare import Prepared
from epycd.plan.result import EndpointResult, failed
from epycd.plan.sharing import Sharing


def is_gpu(prepared: Prepared) -> bool:
    return prepared.spec.device == "instinct"


def place(
    ready: list[Prepared], share: Sharing, approved_gpus: Mapping[str, list[int]]
) -> dict[str, GpuPlacement | EpycError]:
    names = {p.result.name for p in ready}
    requests = [
        GpuRequest(
            name=p.result.name,
            file=p.result.path,
            model=p.facts.model,
            gpus=None if p.spec.gpus == "auto" else list(p.spec.gpus),
            tensor_parallel_size=None
            if p.spec.tensor_parallel_size == "auto"
            else p.spec.tensor_parallel_size,
            weights_bytes=p.facts.weights_bytes or 0,
            kept=approved_gpus.get(p.result.name),
        )
        for p in ready
    ]
    held = {name: gpus for name, gpus in approved_gpus.items() if name not in names}
    return place_gpus(requests, share.host, shipped_gpus(), held)


def cpu_view(
    host: HostFacts,
    placements: Mapping[str, GpuPlacement | EpycError],
    approved_gpus: Mapping[str, list[int]],
    planned: set[str],
) -> HostFacts:
    """The host without the NUMA nodes of placed GPU endpoints and of approved ones not
    planned in this round."""
    held = {i for name, gpus in approved_gpus.items() if name not in planned for i in gpus}
    nodes = gpu_nodes(placements) | {
        gpu.numa_node for gpu in host.gpus if gpu.index in held and gpu.numa_node is not None
    }
    return cpu_host_view(host, nodes)


def plan_one(
    prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
) -> EndpointResult:
    try:
        decisions = decide_gpu(prepared, share, placement, port)
    except EpycError as exc:
        return failed(prepared.result, exc, model_facts=prepared.facts, route=prepared.route)
    return plan_result(prepared, decisions, share)
