"""Every decision for one placed llama.cpp endpoint (`decide_llama`, docs/tuning.md rule 10):
its threads from the placed cores, its slots from the profile or the file, the context (one
KV pool the slots share, as llama-server sizes its own) from the file or the GGUF's training
context cut to what fits, the prompt cache from what the fit leaves, the weights mapped and
locked, and its typed invocation (`epycd.engines.llama_cpp.plan.model`).

The fit (`fit_llama`, rule 9): the process at its peak (`epycd.engines.llama_cpp.model.memory`)
plus rule 3's OS headroom against what the socket has available; where it does not fit, the
largest context that does. Unlike vLLM, llama-server takes no pool share of the socket up
front: its KV cache is exactly the cells it is given (`-c`), so the fit is the process's own
bytes, nothing reserved."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Literal

from epycd.engines.llama_cpp.model.memory import (
    CELL_PADDING,
    DEFAULT_UBATCH,
    LlamaMemory,
    llama_memory,
)
from epycd.engines.llama_cpp.plan.fit import fit_words_at, measured_memory_at
from epycd.engines.llama_cpp.plan.model import (
    LlamaFit,
    LlamaInvocation,
    LlamaRoute,
    LlamaServer,
    LoadMode,
    pooling_served,
)
from epycd.engines.llama_cpp.spec import LlamaKeys
from epycd.errors import Refusal
from epycd.host.facts import HostFacts
from epycd.model.facts import GgufFile
from epycd.plan.model import HfCacheMount
from epycd.plan.placement.alloc import Placement, node_memory
from epycd.plan.prepared import Prepared
from epycd.plan.service.homes import in_a_home
from epycd.plan.service.served import Placed, served_fields, served_model, service_fields
from epycd.plan.tuning import Profile, headroom_gib
from epycd.sizes import GIB, gib
from epycd.stack import Stack

PROFILE_SLOTS: dict[Profile, int] = {"latency": 1, "balanced": 4, "throughput": 8}
"""Rule 10: requests served at once. balanced is llama-server's own default (-np auto: 4);
latency gives one request every core, throughput batches more at once."""
CACHE_RAM_MAX_MIB = 8192
"""llama-server's own default prompt cache (--cache-ram 8192), the most the plan gives."""
PLAN_LOAD_MODE: LoadMode = "mmap+mlock"
"""Rule 10: the weights mapped and locked in RAM."""
CACHE_RAM_SHARE = 0.5
"""The share of what the fit leaves free that the prompt cache may fill."""


def slots_for(prepared: Prepared) -> int:
    return prepared.spec.max_num_seqs or PROFILE_SLOTS[prepared.spec.profile]


def pooling_of(prepared: Prepared) -> Literal["embedding", "rerank"] | None:
    return pooling_served(prepared.facts.primary_endpoint)


def ubatch_for(prepared: Prepared, context: int) -> int:
    return pooling_ubatch(prepared.facts.pooling, context)


def pooling_ubatch(pooling: bool, context: int) -> int:
    """llama-server's physical batch: its own default, but for an embedder or a reranker the
    context, since such an input is read whole in one step (a longer one is refused: "input
    is too large to process. increase the physical batch size")."""
    return context if pooling else DEFAULT_UBATCH


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


MemoryAt = Callable[[int], LlamaMemory]
"""The process's memory at a context (tokens of the shared pool, or per slot)."""


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
        ubatch = ubatch_for(prepared, tokens)
        return fit_llama(
            gguf,
            context=tokens,
            slots=slots_for(prepared),
            cpu_flags=host.flags,
            total_gib=memory.total,
            available_gib=memory.available,
            ubatch=ubatch,
            shared_pool=True,
            embeddings=prepared.facts.pooling,
            memory_at=plan_memory_at(prepared, gguf, host, placement, ubatch),
        )

    try:
        sized = fit(context)
        if not sized.fits and prepared.spec.max_model_len is None and sized.suggested_context:
            warnings.append(
                f"a context of {context} tokens does not fit: {sized.suggested_context} does "
                "(set max_model_len to choose)"
            )
            sized = fit(sized.suggested_context)
    except Refusal as unknown:
        raise Refusal(
            f"the memory of llama-server serving {gguf.file} is unknown: {unknown.message}",
            file=prepared.result.path,
            key=unknown.key or "model",
            fix=unknown.fix,
        ) from None
    return sized, warnings


def plan_memory_at(
    prepared: Prepared, gguf: GgufFile, host: HostFacts, placement: Placement, ubatch: int
) -> MemoryAt:
    """The memory of the plan's llama-server at a context (`memory_source`), asked of the
    route's own llama-server at the exact words the plan gives it."""
    route = prepared.route
    assert isinstance(route, LlamaRoute), "prepared by its planner"
    slots = slots_for(prepared)
    words_at = fit_words_at(
        os.path.realpath(gguf.path), threads=len(placement.cpus), slots=slots, ubatch=ubatch,
        pooling=pooling_of(prepared), load_mode=PLAN_LOAD_MODE,
        speculative=LlamaKeys.of(prepared.spec).speculative,
    )  # fmt: skip
    return memory_source(
        gguf, slots=slots, cpu_flags=host.flags, ubatch=ubatch, shared_pool=True,
        embeddings=prepared.facts.pooling, llama_server=route.llama_server, words_at=words_at,
    )  # fmt: skip


def memory_source(
    gguf: GgufFile,
    *,
    slots: int,
    cpu_flags: Collection[str],
    ubatch: int,
    shared_pool: bool,
    embeddings: bool,
    llama_server: str | None,
    words_at: Callable[[int], list[str]],
) -> MemoryAt:
    """llama-server's own pass at the words `words_at(cells)` (rule 9,
    `epycd.engines.llama_cpp.plan.fit`), for every architecture the pinned llama.cpp loads.
    Only where there is no llama-server to ask (`llama_server` None: `estimate` on a host
    without the llama.cpp runtime) the measured formulas stand in, for the architectures they
    cover (llama, qwen2, qwen3, BERT; `UnmeasuredModel` for the others)."""
    if llama_server is None:
        return formula_memory_at(
            gguf, slots=slots, cpu_flags=cpu_flags, ubatch=ubatch, shared_pool=shared_pool,
            embeddings=embeddings,
        )  # fmt: skip
    return measured_memory_at(
        llama_server, gguf, words_at, slots=slots, ubatch=ubatch, embeddings=embeddings,
        shared_pool=shared_pool,
    )  # fmt: skip


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
) -> LlamaServer:
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
    pooling = pooling_of(prepared)
    invocation = LlamaInvocation(
        model_path=model_path,
        alias=chosen.served,
        host=prepared.spec.host,
        port=port,
        threads=len(placement.cpus),
        slots=fit.slots,
        context=fit.context,
        ubatch=ubatch_for(prepared, fit.context),
        pooling=pooling,
        cache_ram_mib=0 if pooling else cache_ram_mib(fit),
        load_mode=PLAN_LOAD_MODE,
        chat_template_file=prepared.spec.chat_template,
        speculative=LlamaKeys.of(prepared.spec).speculative,
    )
    return LlamaServer(
        **served_fields(prepared, chosen),
        **service_fields(prepared, chosen, placed, host, stack, product_python, status_file),
        llama_server=route.llama_server,
        llama_version=route.llama_version,
        gguf_file=gguf.file,
        socket_reason=placement.reason,
        cpus=placement.cpulist,
        fit=fit,
        invocation=invocation,
        home_read_paths=home_paths(route, model_path, prepared.spec.chat_template),
    )


def formula_memory_at(
    gguf: GgufFile,
    *,
    slots: int,
    cpu_flags: Collection[str],
    ubatch: int = DEFAULT_UBATCH,
    shared_pool: bool = False,
    embeddings: bool = False,
) -> MemoryAt:
    """The measured formulas' memory (`epycd.engines.llama_cpp.model.memory`); raises
    `UnmeasuredModel` where a term is unknown."""

    def memory_at(tokens: int) -> LlamaMemory:
        return llama_memory(
            gguf,
            context=tokens,
            slots=slots,
            cpu_flags=cpu_flags,
            ubatch=ubatch,
            shared_pool=shared_pool,
            embeddings=embeddings,
        )

    return memory_at


def fit_llama(
    gguf: GgufFile,
    *,
    context: int,
    slots: int,
    cpu_flags: Collection[str],
    total_gib: float,
    available_gib: float,
    ubatch: int = DEFAULT_UBATCH,
    shared_pool: bool = False,
    embeddings: bool = False,
    memory_at: MemoryAt | None = None,
) -> LlamaFit:
    """`shared_pool`: the slots share one pool of `context` cells (the plan's, rule 10), else
    each has its own `context` in the pool; `embeddings`: an embedder or a reranker;
    `memory_at`: where the figures come from, the formulas unless given. Raises
    `UnmeasuredModel` where a formula's term is unknown, a Refusal where llama.cpp cannot say."""
    memory_at = memory_at or formula_memory_at(
        gguf, slots=slots, cpu_flags=cpu_flags, ubatch=ubatch, shared_pool=shared_pool,
        embeddings=embeddings,
    )  # fmt: skip
    memory = memory_at(context)
    headroom = headroom_gib(total_gib)
    required = memory.total_bytes / GIB + headroom
    fits = required <= available_gib
    suggested = (
        None
        if fits
        else _largest_context(
            memory_at, slots, available_gib - headroom, shared_pool=shared_pool, too_large=memory
        )
    )
    return LlamaFit(
        context=context,
        slots=slots,
        memory=memory,
        process_gb=gib(memory.total_bytes),
        headroom_gb=round(headroom, 2),
        required_gb=round(required, 2),
        available_gb=round(available_gib, 2),
        fits=fits,
        suggested_context=suggested,
        action=_action(fits, context, slots, suggested, shared_pool=shared_pool),
    )


FIT_STEPS = 4
"""Steps down from the solved context before giving up: the first is exact for the formulas,
the second for llama.cpp's MiB-rounded figures."""


def _largest_context(
    memory_at: Callable[[int], LlamaMemory],
    slots: int,
    budget_gib: float,
    *,
    shared_pool: bool,
    too_large: LlamaMemory,
) -> int | None:
    """The most tokens per slot (a multiple of 256) whose process fits in `budget_gib`: the
    process grows linearly with the cells (KV and the attention mask), so solve for them
    between the smallest pool and the one that did not fit (`too_large`), far apart since
    llama.cpp's own figures are whole MiB, then step down until the answer fits."""
    smallest = memory_at(CELL_PADDING)
    budget = budget_gib * GIB
    if smallest.total_bytes > budget or too_large.cells <= smallest.cells:
        return None  # nothing fits, or the context costs nothing (an encoder: no cache)
    per_cell = (too_large.total_bytes - smallest.total_bytes) / (too_large.cells - smallest.cells)
    if per_cell <= 0:
        return None
    step = 1 if shared_pool else slots
    cells = smallest.cells + int((budget - smallest.total_bytes) // per_cell)
    for _ in range(FIT_STEPS):
        context = (cells // step) // CELL_PADDING * CELL_PADDING
        if context < CELL_PADDING:
            return None
        over = memory_at(context).total_bytes - budget
        if over <= 0:
            return context
        cells = context * step - max(int(over // per_cell), 1) - CELL_PADDING * step
    return None


def _action(
    fits: bool, context: int, slots: int, suggested: int | None, *, shared_pool: bool
) -> str:
    layout = (
        f"{slots} slots sharing {context} tokens"
        if shared_pool
        else f"{slots} slots of {context} tokens"
    )
    if fits:
        return f"fits: {layout}"
    if suggested is None:
        return (
            "does not fit: the weights alone leave no room; "
            "use a smaller quantization or a larger socket"
        )
    if shared_pool:
        return f"does not fit with {layout}; {suggested} tokens fit (or a smaller quantization)"
    return (
        f"does not fit at {layout}; {suggested} tokens per slot fit "
        "(or fewer slots, or a smaller quantization)"
    )
