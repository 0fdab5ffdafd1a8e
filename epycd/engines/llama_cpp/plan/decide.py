"""Every decision for one placed llama.cpp endpoint (`decide_llama`, docs/tuning.md rule 10):
its threads from the placed cores, its slots from the profile or the file, the context (one
KV pool the slots share, as llama-server sizes its own) from the file or the GGUF's training
context cut to what fits (`epycd.engines.llama_cpp.plan.sizing`), the prompt cache from what the fit
leaves, the weights mapped and locked, and its typed invocation
(`epycd.engines.llama_cpp.plan.invocation`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from epycd.engines.llama_cpp.model.memory import DEFAULT_UBATCH, UnmeasuredModel
from epycd.engines.llama_cpp.plan.invocation import LlamaInvocation, llama_server_argv
from epycd.engines.llama_cpp.plan.model import LlamaEndpoint
from epycd.engines.llama_cpp.plan.route import LlamaRoute
from epycd.engines.llama_cpp.plan.sizing import LlamaFit, fit_llama
from epycd.errors import Refusal
from epycd.host.facts import HostFacts
from epycd.model.facts import GgufFile
from epycd.plan.alloc import Placement
from epycd.plan.homes import in_a_home
from epycd.plan.model import HfCacheMount
from epycd.plan.prepared import Prepared
from epycd.plan.served import Placed, served_fields, served_model, service_fields
from epycd.plan.sizing import node_memory
from epycd.plan.tuning import Profile
from epycd.stack import Stack

PROFILE_SLOTS: dict[Profile, int] = {"latency": 1, "balanced": 4, "throughput": 8}
"""Rule 10: requests served at once. balanced is llama-server's own default (-np auto: 4);
latency gives one request every core, throughput batches more at once."""
CACHE_RAM_MAX_MIB = 8192
"""llama-server's own default prompt cache (--cache-ram 8192), the most the plan gives."""
CACHE_RAM_SHARE = 0.5
"""The share of what the fit leaves free that the prompt cache may fill."""


def slots_for(prepared: Prepared) -> int:
    return prepared.spec.max_num_seqs or PROFILE_SLOTS[prepared.spec.profile]


def context_request(prepared: Prepared, gguf: GgufFile) -> tuple[int, list[str]]:
    """The context asked for: the file's max_model_len, else the training context; the
    file's capped to the training context, with a warning."""
    trained = gguf.context_length
    asked = prepared.spec.max_model_len
    if asked is None:
        if trained is None:
            raise Refusal(
                f"{gguf.file} gives no context length ({gguf.architecture}.context_length)",
                file=prepared.result.path,
                key="max_model_len",
                fix="give max_model_len = the tokens one request may hold",
            )
        return trained, []
    if trained is not None and asked > trained:
        return trained, [f"max_model_len {asked} is capped to the model's {trained}"]
    return asked, []


def llama_fit(
    prepared: Prepared,
    gguf: GgufFile,
    host: HostFacts,
    placement: Placement,
    memory_share: float = 1.0,
) -> tuple[LlamaFit, list[str]]:
    """The fit on the placement's nodes (`memory_share` of them: an instance of a set shares
    its node with the others there); a context the file did not give is cut to the most
    that fits (with a warning), one it gave is kept and refused when it does not fit."""
    context, warnings = context_request(prepared, gguf)
    memory = node_memory(host, placement, placement.cpus, memory_share)

    def fit(tokens: int) -> LlamaFit:
        return fit_llama(
            gguf,
            context=tokens,
            slots=slots_for(prepared),
            cpu_flags=host.flags,
            total_gib=memory.total,
            available_gib=memory.available,
            ubatch=DEFAULT_UBATCH,
            shared_pool=True,
        )

    try:
        sized = fit(context)
        if not sized.fits and prepared.spec.max_model_len is None and sized.suggested_context:
            warnings.append(
                f"a context of {context} tokens does not fit: {sized.suggested_context} does "
                "(set max_model_len to choose)"
            )
            sized = fit(sized.suggested_context)
    except UnmeasuredModel as unknown:
        raise Refusal(
            f"the memory of llama-server serving {gguf.file} is unknown: {unknown}",
            file=prepared.result.path,
            key="model",
            fix="serve a llama, qwen2 or qwen3 GGUF (docs/tuning.md rule 9)",
        ) from None
    return sized, warnings


def cache_ram_mib(fit: LlamaFit) -> int:
    """Rule 10: the prompt cache takes half of what the fit leaves free, at most
    llama-server's own 8 GiB; none when nothing is left."""
    spare_gib = max(fit.available_gb - fit.required_gb, 0.0)
    return min(int(spare_gib * 1024 * CACHE_RAM_SHARE), CACHE_RAM_MAX_MIB)


def home_paths(route: LlamaRoute, model_path: str, template: str | None) -> list[str]:
    """What the unit reads under /root or /home: the runtime's folder, the GGUF file, the
    chat template."""
    runtime = str(Path(os.path.realpath(route.llama_server)).parent.parent)
    candidates = [runtime, model_path, *([os.path.realpath(template)] if template else [])]
    return sorted({path for path in candidates if in_a_home(path)})


def decide_llama(
    prepared: Prepared,
    *,
    host: HostFacts,
    stack: Stack,
    placement: Placement,
    port: int,
    hf_cache: HfCacheMount,
    product_python: str,
    status_file: str,
    memory_share: float = 1.0,
) -> LlamaEndpoint:
    """Every decision for one placed llama.cpp endpoint, or one instance of a set."""
    route, gguf = prepared.route, prepared.facts.gguf
    assert isinstance(route, LlamaRoute) and gguf is not None, "prepared by its planner"
    fit, fit_warnings = llama_fit(prepared, gguf, host, placement, memory_share)
    chosen = served_model(prepared, stack, hf_cache, containerized=False)
    chosen = dataclasses.replace(chosen, dtype=gguf.file_type or "gguf")
    placed = Placed(
        placement.socket, placement.numa_nodes, port, placement.warnings + fit_warnings, []
    )
    model_path = os.path.realpath(gguf.path)
    invocation = LlamaInvocation(
        model_path=model_path,
        alias=chosen.served,
        host=prepared.spec.host,
        port=port,
        threads=len(placement.cpus),
        slots=fit.slots,
        context=fit.context,
        ubatch=DEFAULT_UBATCH,
        cache_ram_mib=cache_ram_mib(fit),
        load_mode="mmap+mlock",
        chat_template_file=prepared.spec.chat_template,
    )
    return LlamaEndpoint(
        **served_fields(prepared, chosen),
        **service_fields(prepared, chosen, placed, host, stack, product_python, status_file),
        llama_server=route.llama_server,
        llama_version=route.llama_version,
        gguf_file=gguf.file,
        socket_reason=placement.reason,
        cpus=placement.cpulist,
        fit=fit,
        server_args=llama_server_argv(invocation),
        invocation=invocation,
        home_read_paths=home_paths(route, model_path, prepared.spec.chat_template),
    )
