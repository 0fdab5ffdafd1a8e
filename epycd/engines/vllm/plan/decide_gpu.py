"""Every decision for one placed Instinct GPU endpoint (docs/instinct.md): the recipe's args
and env with the per-gfx overrides, the GPUs (HIP_VISIBLE_DEVICES), the tensor-parallel size
and the CPU pin of the GPUs' nodes. Its route (the ROCm vLLM image in podman or docker) and
the refusal of a model that is no LLM endpoint are `epycd.plan.route`'s (`gpu_route`,
`refuse_not_llm`).

The recipe's model data is `data/instinct-recipes.json` (`epycd.model.instinct`).
"""

from __future__ import annotations

from epycd.engines.vllm.model.gpu_memory import GpuFit
from epycd.engines.vllm.plan.invocation import RocmEngine, VllmInvocation, serve_invocation
from epycd.engines.vllm.plan.model import VllmInstinctServer
from epycd.engines.vllm.plan.route import VllmRoute, vllm_route_fields
from epycd.host.cpulist import format_cpulist
from epycd.model.facts import ModelFacts
from epycd.model.instinct import (
    InstinctRecipes,
    Recipe,
    recipe_for,
    shipped_gpus,
    shipped_recipes,
)
from epycd.paths import endpoint_status_file
from epycd.plan.placement.gpu import GpuPlacement
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import Prepared
from epycd.plan.service.served import (
    Placed,
    ServedModel,
    served_fields,
    served_model,
    service_fields,
)
from epycd.sizes import GIB
from epycd.spec import EndpointSpec
from epycd.spec.policy import consent_reasons

GPU_VISIBLE = "HIP_VISIBLE_DEVICES"
PLAN_GPU_FLAGS = ("--tensor-parallel-size", "--distributed-executor-backend")
"""Flags an endpoint file may not pass (epycd.spec) that the GPU plan passes itself."""
AUTO_TOOL_CHOICE = "--enable-auto-tool-choice"
CONTEXT_STEP = 256


def recipe_args(model: str, recipes: InstinctRecipes) -> tuple[list[str], Recipe | None]:
    """base_args + AMD extra args + tool-calling + reasoning args, or the generic set."""
    found = recipe_for(model, recipes)
    if found is None:
        return list(recipes.generic_args), None
    recipe = found[1]
    args = [
        *recipe.base_args,
        *recipe.amd_extra_args,
        *recipe.tool_calling_args,
        *recipe.reasoning_args,
    ]
    if args and AUTO_TOOL_CHOICE not in args and recipe.tool_calling_args:
        args.append(AUTO_TOOL_CHOICE)
    return args, recipe


def gpu_env(placement: GpuPlacement, recipe: Recipe | None, spec: EndpointSpec) -> dict[str, str]:
    """The gfx's env defaults, the recipe's env, the file's env; the GPUs by index. Never
    CUDA_VISIBLE_DEVICES: ROCm maps it, and empty it hides every GPU."""
    config = shipped_gpus().gpu_configs.get(placement.gfx_version)
    env = dict(config.env_defaults) if config else {}
    if recipe is not None:
        env |= recipe.base_env | recipe.amd_extra_env
    env |= spec.env
    env[GPU_VISIBLE] = ",".join(map(str, placement.gpus))
    return env


def gpu_context(spec: EndpointSpec, facts: ModelFacts, fit: GpuFit) -> tuple[int, list[str]]:
    """max_model_len: the file's, else the model's, within what the KV room holds."""
    room = int(fit.remaining_for_kv_gb * fit.tensor_parallel_size * GIB)
    capacity = room // max(facts.kv_bytes_per_token, 1)
    wanted = spec.max_model_len or facts.max_position_embeddings or 4096
    if capacity >= wanted:
        return wanted, []
    limited = max(CONTEXT_STEP, capacity // CONTEXT_STEP * CONTEXT_STEP)
    return limited, [
        f"the KV room ({fit.remaining_for_kv_gb:g} GiB per GPU) holds {capacity} tokens: "
        f"max_model_len {limited}, not {wanted}; --kv-cache-dtype fp8 in extra_args holds more"
    ]


def gpu_invocation(
    spec: EndpointSpec,
    placement: GpuPlacement,
    recipe: tuple[list[str], Recipe | None],
    chosen: ServedModel,
    context: int,
    port: int,
) -> VllmInvocation:
    """The recipe's args, the GPUs' tensor parallelism (`mp` for a MoE recipe over several),
    eager in the VRAM fit's "tight" tier."""
    fit = vram_fit(placement)
    tp = fit.tensor_parallel_size
    moe = tp > 1 and recipe[1] is not None and recipe[1].moe
    engine = RocmEngine(
        max_num_seqs=spec.max_num_seqs or None,
        recipe_args=list(recipe[0]),
        tensor_parallel_size=tp,
        distributed_executor_backend="mp" if moe else None,
        enforce_eager=fit.tier == "tight",
    )
    return serve_invocation(
        spec,
        model_arg=chosen.model_arg,
        served=chosen.served,
        dtype=chosen.dtype,
        context=context,
        port=port,
        engine=engine,
    )


def vram_fit(placement: GpuPlacement) -> GpuFit:
    """The fit this engine's sizer (`gpus.py`) gave the placement."""
    assert isinstance(placement.fit, GpuFit), type(placement.fit)
    return placement.fit


def gpu_kv_pool_gb(fit: GpuFit) -> int:
    """The KV pool over all the endpoint's GPUs, whole GiB."""
    return int(round(fit.remaining_for_kv_gb * fit.tensor_parallel_size, 2))


def gpu_cpus(placement: GpuPlacement) -> str:
    return format_cpulist(placement.cpus)


def gpu_run_flags() -> list[str]:
    return list(shipped_gpus().docker_flags)


def _recipe_warnings(model: str, recipe: tuple[list[str], Recipe | None]) -> list[str]:
    if recipe[1] is not None:
        return []
    return [
        f"no recipe for {model} in data/instinct-recipes.json: the generic args "
        f"{' '.join(recipe[0])}"
    ]


def decide_gpu(
    prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
) -> VllmInstinctServer:
    spec, facts = prepared.spec, prepared.facts
    chosen = served_model(prepared, share.stack, share.hf_cache, containerized=True)
    fit = vram_fit(placement)
    context, context_warnings = gpu_context(spec, facts, fit)
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
    status = str(endpoint_status_file(share.settings.run_dir, prepared.result.name))
    python = share.product_python
    invocation = gpu_invocation(spec, placement, recipe, chosen, context, port)
    service = {
        **served_fields(prepared, chosen),
        **vllm_route_fields(prepared.route_of(VllmRoute)),
        **service_fields(prepared, chosen, placed, share.host, share.stack, python, status),
    }
    return VllmInstinctServer(
        **(service | VllmInstinctServer.invocation_facts(invocation)),
        backend="rocm",
        socket_reason=f"the NUMA node(s) of GPU(s) {','.join(map(str, placement.gpus))}: "
        + placement.reason,
        cpus=gpu_cpus(placement),
        env=gpu_env(placement, recipe[1], spec),
        kv_cache_gb=gpu_kv_pool_gb(fit),
        invocation=invocation,
        run_flags=gpu_run_flags(),
        gpus=placement.gpus,
        gfx_version=placement.gfx_version,
        gpu_fit=fit,
    )
