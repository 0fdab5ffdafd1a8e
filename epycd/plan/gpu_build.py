"""Instinct GPU endpoints inside `plan_all` (epycd.plan.build): place them first, give the
CPU endpoints the host without their NUMA nodes, and decide each GPU endpoint's plan.
Imported by `build.place_round` when it runs (build is imported here)."""

from __future__ import annotations

from collections.abc import Mapping

from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.model.instinct import shipped_gpus, shipped_recipes
from epycd.names import unit_name
from epycd.paths import endpoint_status_file
from epycd.plan.build import (
    EndpointResult,
    Prepared,
    Sharing,
    _bind_mounts,
    _failed,
    _hf_cache_warnings,
    approval_check_argv,
    exposure_reason,
    finish,
    start_timeout_s,
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
from epycd.plan.model import EndpointDecisions, Problem
from epycd.plan.tuning import LIMIT_MEMLOCK, LIMIT_NOFILE


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


def decide_gpu(
    prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
) -> EndpointDecisions:
    spec, route, facts = prepared.spec, prepared.route, prepared.facts
    name = prepared.result.name
    model = spec.model or share.stack.default_model
    local = model.startswith("/")
    mounts, model_arg = _bind_mounts(spec, model, True)
    hf = share.hf_cache if not local else None
    context, context_warnings = gpu_context(spec, facts, placement.fit)
    served = spec.served_model_name or (name if local else model)
    dtype = spec.dtype or share.stack.default_dtype
    recipe = recipe_args(model, shipped_recipes())
    warnings = [*route.warnings, *prepared.warnings, *placement.warnings, *context_warnings]
    warnings += _hf_cache_warnings(hf, True)
    if recipe[1] is None:
        warnings.append(
            f"no recipe for {model} in data/instinct-recipes.json: the generic args "
            f"{' '.join(recipe[0])}"
        )
    reasons = [*route.confirmation_reasons, *placement.confirmation_reasons]
    if exposed := exposure_reason(spec, port):
        reasons.append(exposed)
    memory = gpu_memory(facts, placement.fit, context)
    python = share.product_python
    return EndpointDecisions(
        endpoint=name,
        unit_name=unit_name(name),
        config_file=str(prepared.result.path),
        model=model,
        model_revision=facts.revision,
        served_model_name=served,
        model_kind=facts.support.kind,
        primary_endpoint="chat_completions"
        if facts.primary_endpoint == "chat_completions"
        else "completions",
        backend="rocm",
        runtime=route.runtime,
        image=route.image,
        image_entrypoint_is_vllm_serve=route.image_entrypoint_is_vllm_serve,
        vllm_version=route.vllm_version,
        dtype=dtype,
        socket=placement.socket,
        socket_reason=f"the NUMA node(s) of GPU(s) {','.join(map(str, placement.gpus))}: "
        + placement.reason,
        cpus=gpu_cpus(placement),
        omp_cpus="",
        numa_nodes=placement.numa_nodes,
        env=gpu_env(placement, recipe[1], spec),
        kv_cache_gb=memory.kv_pool_gb,
        memory=memory,
        port=port,
        host=spec.host,
        max_model_len=context,
        max_num_seqs=spec.max_num_seqs or 0,
        max_num_batched_tokens=0,
        profile=spec.profile,
        enforce_eager=placement.fit.tier == "tight",
        limit_nofile=LIMIT_NOFILE,
        limit_memlock=LIMIT_MEMLOCK,
        vllm_args=gpu_args(spec, placement, recipe, model_arg, context, served, port, dtype),
        run_flags=gpu_run_flags(),
        hf_cache=hf,
        extra_mounts=mounts,
        hf_token_file=spec.hf_token_file,
        api_key_file=spec.api_key_file,
        chat_template=spec.chat_template,
        restart=spec.restart,
        start_timeout_s=start_timeout_s(share.stack, facts),
        podman_notify_healthy=route.runtime == "podman"
        and share.host.runtimes.podman.notify_healthy,
        product_python=python,
        exec_condition=[approval_check_argv(python, name)],
        status_file=str(endpoint_status_file(share.settings.run_dir, name)),
        requires_confirmation=bool(reasons),
        confirmation_reasons=reasons,
        warnings=warnings,
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
        return _failed(prepared.result, exc, model_facts=prepared.facts, route=prepared.route)
    try:
        plan = finish(
            prepared,
            decisions,
            host=share.host,
            stack=share.stack,
            settings=share.settings,
            render=share.render,
        )
    except EpycError as exc:
        decisions.errors.append(Problem.of(exc))
        return _failed(prepared.result, exc, model_facts=prepared.facts, decisions=decisions)
    return EndpointResult(
        endpoint=prepared.result.name,
        config_file=str(prepared.result.path),
        plan=plan,
        model_facts=prepared.facts,
    )
