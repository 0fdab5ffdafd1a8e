"""Every decision for one placed Instinct GPU endpoint (docs/instinct.md): the route (the
ROCm vLLM image in podman or docker), the recipe's args and env with the per-gfx overrides,
the GPUs (HIP_VISIBLE_DEVICES), the tensor-parallel size and the CPU pin of the GPUs' nodes.

The recipe's model data is `data/instinct-recipes.json` (`epycd.model.instinct`); a model
the recipe lists as no LLM endpoint is refused before anything is fetched.
"""

from __future__ import annotations

from pathlib import Path

from epycd.errors import Refusal
from epycd.host.cpulist import format_cpulist
from epycd.host.facts import HostFacts
from epycd.model.facts import MemoryFit, ModelFacts
from epycd.model.gpu_memory import GpuFit
from epycd.model.instinct import (
    InstinctRecipes,
    Recipe,
    floats,
    recipe_for,
    shipped_gpus,
)
from epycd.model.instinct import shipped_recipes as shipped_recipes
from epycd.plan.build import serving_args
from epycd.plan.gpu import GpuPlacement
from epycd.plan.route import RUNTIME_FIX, Route, container_runtime
from epycd.sizes import GIB
from epycd.spec import EndpointSpec
from epycd.stack import Stack

GPU_VISIBLE = "HIP_VISIBLE_DEVICES"
PLAN_GPU_FLAGS = ("--tensor-parallel-size", "--distributed-executor-backend")
"""Flags an endpoint file may not pass (epycd.spec) that the GPU plan passes itself."""
AUTO_TOOL_CHOICE = "--enable-auto-tool-choice"
CONTEXT_STEP = 256


def refuse_not_llm(model: str, file: Path) -> None:
    """The recipe's list of models that are not LLM endpoints: the reason and an alternative."""
    entry = shipped_gpus().not_llm_endpoints.get(model)
    if entry is not None:
        raise Refusal(
            f"{model} is not an LLM endpoint: {entry.reason}",
            file=file,
            key="model",
            fix=entry.alternative,
        )


def gpu_route(spec: EndpointSpec, host: HostFacts, stack: Stack, file: Path) -> Route:
    """podman with Quadlet or a reachable docker (auto takes them in that order), the image
    of the file, else the model's recipe, else the recipe data's ROCm vLLM image."""
    runtime = container_runtime(host.runtimes) if spec.runtime == "auto" else spec.runtime
    ready = {
        "podman": host.runtimes.podman.quadlet,
        "docker": host.runtimes.docker.daemon_reachable,
    }
    if runtime not in ready or not ready[runtime]:
        raise Refusal(
            "an Instinct endpoint runs in a container: "
            + (f"{runtime} is not usable here" if runtime else "no podman with Quadlet, no docker"),
            file=file,
            key="runtime",
            fix=RUNTIME_FIX,
        )
    recipes = shipped_recipes()
    found = recipe_for(spec.model or stack.default_model, recipes)
    image = spec.image or (found[1].docker_image if found else None) or recipes.docker_image
    warnings = []
    if floats(image):
        warnings.append(
            f"{image} is not pinned: approve pulls it once and records its digest; later "
            "starts keep that image, a later pull may change it"
        )
    return Route(
        backend="rocm",
        runtime=runtime,
        image=image,
        image_entrypoint_is_vllm_serve=True,
        vllm_version=stack.vllm_version,
        warnings=warnings,
    )


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


def gpu_args(
    spec: EndpointSpec,
    placement: GpuPlacement,
    recipe: tuple[list[str], Recipe | None],
    model_arg: str,
    context: int,
    served: str,
    port: int,
    dtype: str,
) -> list[str]:
    args = [model_arg, "--dtype", dtype, "--max-model-len", str(context)]
    if spec.max_num_seqs:
        args += ["--max-num-seqs", str(spec.max_num_seqs)]
    args += recipe[0]
    tp = placement.fit.tensor_parallel_size
    if tp > 1:
        args += ["--tensor-parallel-size", str(tp)]
        if recipe[1] is not None and recipe[1].moe:
            args += ["--distributed-executor-backend", "mp"]
    if placement.fit.tier == "tight":
        args.append("--enforce-eager")
    return args + serving_args(spec, port, served)


def gpu_memory(facts: ModelFacts, fit: GpuFit, context: int) -> MemoryFit:
    """The VRAM fit in the plan's memory figures: required and available are the GPUs'
    VRAM (the boot check compares the socket's RAM only with CPU plans' needs)."""
    tp = fit.tensor_parallel_size
    kv = round(fit.remaining_for_kv_gb * tp, 2)
    return MemoryFit(
        weights_gb=round((facts.weights_bytes or 0) / GIB, 2),
        kv_bytes_per_token=facts.kv_bytes_per_token,
        context=context,
        max_num_seqs=0,
        kv_gb=kv,
        kv_pool_gb=int(kv),
        headroom_gb=fit.overhead_gb * tp,
        required_gb=0.0,
        available_gb=round(fit.vram_gb * tp, 2),
        fits=True,
        suggested_max_model_len=context,
        action="",
    )


def gpu_cpus(placement: GpuPlacement) -> str:
    return format_cpulist(placement.cpus)


def gpu_run_flags() -> list[str]:
    return list(shipped_gpus().docker_flags)
