"""The fit of one llama-server process in a socket's memory (docs/tuning.md rule 9): the
process at its peak (`epycd.engines.llama_cpp.model.memory`), plus rule 3's OS headroom,
against what the socket has available; where it does not fit, the largest context per slot
that does.

Unlike vLLM, llama-server takes no pool share of the socket up front: its KV cache is exactly
the cells it is given (`-c`), so the fit is the process's own bytes, nothing reserved."""

from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel, Field

from epycd.engines.llama_cpp.model.memory import (
    CELL_PADDING,
    DEFAULT_UBATCH,
    LlamaMemory,
    llama_memory,
)
from epycd.model.facts import GgufFile
from epycd.plan.tuning import headroom_gib
from epycd.sizes import GIB, gib


class LlamaFit(BaseModel):
    """A llama.cpp endpoint's fit in one socket, GiB where not said otherwise."""

    context: int = Field(description="tokens per slot, or of the one pool the slots share")
    slots: int
    memory: LlamaMemory
    process_gb: float = Field(description="the server process at its peak")
    headroom_gb: float = Field(description="the OS's share, apart from the server (rule 3)")
    required_gb: float = Field(description="process_gb + headroom_gb")
    available_gb: float
    fits: bool
    suggested_context: int | None = Field(
        description="where it does not fit: the most tokens (per slot, or of the shared pool) "
        "that do, a multiple of 256"
    )
    action: str


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
) -> LlamaFit:
    """`shared_pool`: the slots share one pool of `context` cells (the plan's, rule 10), else
    each has its own `context` in the pool. Raises `UnmeasuredModel`
    (`epycd.engines.llama_cpp.model.memory`) where a term is unknown."""
    memory = llama_memory(
        gguf,
        context=context,
        slots=slots,
        cpu_flags=cpu_flags,
        ubatch=ubatch,
        shared_pool=shared_pool,
    )
    headroom = headroom_gib(total_gib)
    required = memory.total_bytes / GIB + headroom
    fits = required <= available_gib
    suggested = (
        None
        if fits
        else _largest_context(
            gguf, slots, cpu_flags, ubatch, available_gib - headroom, shared_pool=shared_pool
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


def _largest_context(
    gguf: GgufFile,
    slots: int,
    cpu_flags: Collection[str],
    ubatch: int,
    budget_gib: float,
    *,
    shared_pool: bool,
) -> int | None:
    """The most tokens per slot (a multiple of 256) whose process fits in `budget_gib`: the
    process grows linearly with the cells (KV and the attention mask), so solve for them."""

    def at(context: int) -> LlamaMemory:
        return llama_memory(
            gguf,
            context=context,
            slots=slots,
            cpu_flags=cpu_flags,
            ubatch=ubatch,
            shared_pool=shared_pool,
        )

    smallest, larger = at(CELL_PADDING), at(2 * CELL_PADDING)
    per_cell = (larger.total_bytes - smallest.total_bytes) / (larger.cells - smallest.cells)
    spare = budget_gib * GIB - smallest.total_bytes
    if spare < 0:
        return None
    cells = smallest.cells + int(spare // per_cell)
    context = (cells // (1 if shared_pool else slots)) // CELL_PADDING * CELL_PADDING
    return context if context >= CELL_PADDING else None


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
