"""Instinct GPU endpoints inside `plan_all` (epycd.plan.build): place them first, give the
CPU endpoints the host without their NUMA nodes, and decide each GPU endpoint's plan.
Imported by `build.place_round` when it runs (build is imported here)."""

from __future__ import annotations

from collections.abc import Mapping

from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.model.instinct import Recipe, shipped_gpus, shipped_recipes
from epycd.paths import endpoint_status_file
from epycd.plan.build import (
    Placed,
    Sharing,
    plan_result,
    served_fields,
    served_model,
    service_fields,
)
from epycd.plan.gpu import GpuPlacement, GpuRequest, cpu_host_view, gpu_nodes, place_gpus
from epycd.plan.gpu_decide import (
    gpu_args,
    gpu_context,
    gpu_cpus,
    gpu_env,
    gpu_memory,
    gpu_run_flags,
    recipe_args,
)
from epycd.plan.model import EndpointDecisions
from epycd.plan.prepare import Prepared
from epycd.plan.result import EndpointResult, failed
from epycd.spec import consent_reasons


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


def _recipe_warnings(model: str, recipe: tuple[list[str], Recipe | None]) -> list[str]:
    if recipe[1] is not None:
        return []
    return [
        f"no recipe for {model} in data/instinct-recipes.json: the generic args "
        f"{' '.join(recipe[0])}"
    ]


def decide_gpu(
    prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
) -> EndpointDecisions:
    spec, facts = prepared.spec, prepared.facts
    chosen = served_model(prepared, share.stack, share.hf_cache, containerized=True)
    context, context_warnings = gpu_context(spec, facts, placement.fit)
    recipe = recipe_args(chosen.model, shipped_recipes())
    placed = Placed(
        placement.socket,
        placement.numa_nodes,
        port,
        warnings=[*placement.warnings, *context_warnings],
        device_warnings=_recipe_warnings(chosen.model, recipe),
        confirmation_reasons=placement.confirmation_reasons
        + consent_reasons(recipe[0], {}, where="the Instinct recipe's args"),
    )
    memory = gpu_memory(facts, placement.fit, context)
    status = str(endpoint_status_file(share.settings.run_dir, prepared.result.name))
    python = share.product_python
    return EndpointDecisions(
        **served_fields(prepared, chosen),
        **service_fields(prepared, chosen, placed, share.host, share.stack, python, status),
        backend="rocm",
        socket_reason=f"the NUMA node(s) of GPU(s) {','.join(map(str, placement.gpus))}: "
        + placement.reason,
        cpus=gpu_cpus(placement),
        omp_cpus="",
        env=gpu_env(placement, recipe[1], spec),
        kv_cache_gb=memory.kv_pool_gb,
        memory=memory,
        max_model_len=context,
        max_num_seqs=spec.max_num_seqs or 0,
        max_num_batched_tokens=0,
        enforce_eager=placement.fit.tier == "tight",
        vllm_args=gpu_args(
            spec, placement, recipe, chosen.model_arg, context, chosen.served, port, chosen.dtype
        ),
        run_flags=gpu_run_flags(),
        device="instinct",
        gpus=placement.gpus,
        gfx_version=placement.gfx_version,
        tensor_parallel_size=placement.fit.tensor_parallel_size,
        gpu_fit=placement.fit,
    )


def plan_one(
    prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
) -> EndpointResult:
    try:
        decisions = decide_gpu(prepared, share, placement, port)
    except EpycError as exc:
        return failed(prepared.result, exc, model_facts=prepared.facts, route=prepared.route)
    return plan_result(prepared, decisions, share)
