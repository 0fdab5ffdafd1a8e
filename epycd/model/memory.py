"""Does a model fit one socket's memory? (issue 3; anchor-facts.md, "Formulas" and
"vLLM's own CPU memory rules"). Pure functions, GiB throughout (2^30 bytes).

Weights, the KV pool vLLM is given, vLLM's own runtime (its processes beside weights and KV,
measured: `epycd.model.footprint`, issue 17) and the OS headroom must add up inside the chosen
socket's memory (the recipe checked total host RAM and forgot the pool it pre-allocates). The
first three are the server's process tree at its peak (`process_gb`). The KV pool cap is the
tuner's (`kv_pool_gib`), cut down to what is free beside the tree's other parts and headroom,
and to what the socket's first NUMA node has free (vLLM checks the pool against that node).
Inside that cap the pool is what the sequences need (issue 12, docs/tuning.md rule 3):
max_num_seqs x context x KV bytes per token plus `KV_MARGIN`, in whole GiB, at least one
full-context sequence. Without an explicit max_num_seqs, the profile's target is cut to the
full-context sequences the cap holds (rule 2).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from epycd.errors import InputError
from epycd.model.facts import MemoryFit
from epycd.sizes import GIB

KV_MARGIN = 0.10
"""Over the sequences' own KV: vLLM rounds every sequence up to whole KV blocks and keeps
blocks for prefix caching; 10 % covers a 4096-token sequence's last partial 128-token block
three times over."""
DEFAULT_MAX_MODEL_LEN: int | None = None
"""None: the model's full context, which is what `vllm serve` uses without --max-model-len."""
LENGTH_STEP = 256
MIN_POOL_GIB = 1


def kv_pool_gib(socket_total_gib: float) -> int:
    """The tuner's KV pool: half of a small socket (<= 32 GiB), else min(40 %, total - 16)."""
    if socket_total_gib <= 32:
        pool = socket_total_gib / 2
    else:
        pool = min(0.4 * socket_total_gib, socket_total_gib - 16)
    return max(MIN_POOL_GIB, math.floor(pool))


def headroom_gib(socket_total_gib: float) -> float:
    """The OS's share, apart from the server's tree: 10 % of the socket, 2 to 16 GiB.

    The recipe reserves a flat 16 GB, which on a 16-32 GiB socket leaves nothing for weights
    and KV; 10 % keeps small sockets usable and reaches the recipe's 16 GiB from 160 GiB up.
    """
    return min(16.0, max(2.0, 0.1 * socket_total_gib))


def context_length(max_model_len: int | None, max_position_embeddings: int | None) -> int:
    """min(max_model_len or max positions, max positions)."""
    candidates = [v for v in (max_model_len, max_position_embeddings) if v]
    if not candidates:
        raise InputError(
            "the model's config has no max_position_embeddings",
            key="max_model_len",
            fix="give --max-model-len (max_model_len in the endpoint file)",
        )
    return min(candidates)


def fit_memory(
    *,
    weights_bytes: int,
    kv_bytes_per_token: int,
    max_position_embeddings: int | None,
    max_model_len: int | None,
    max_num_seqs: int | None,
    socket_total_gib: float,
    socket_available_gib: float,
    runtime_gib: float,
    first_node_available_gib: float | None = None,
    target_seqs: int = 1,
) -> MemoryFit:
    """The fit of weights + KV pool + runtime + headroom in one socket, and what to change if
    it fails. `runtime_gib` is vLLM's own processes (`Footprint.runtime_gib`).

    `max_num_seqs` None: `target_seqs` (the profile's), or fewer when the pool cap holds fewer
    full-context sequences, never below 1. `first_node_available_gib` is the free memory of
    the socket's first NUMA node; the weights' share on it is taken in proportion to that
    node's part of the socket's free memory.
    """
    _check_counts(max_num_seqs, max_model_len)
    context = context_length(max_model_len, max_position_embeddings)
    weights = weights_bytes / GIB
    headroom = headroom_gib(socket_total_gib)
    cap = pool_cap_gib(weights + runtime_gib, headroom, socket_total_gib, socket_available_gib,
                       first_node_available_gib)  # fmt: skip
    sized = _size_pool(cap, kv_bytes_per_token, context, max_num_seqs, target_seqs)
    return _memory_fit(
        sized,
        cap=cap,
        weights=weights,
        runtime=runtime_gib,
        headroom=headroom,
        available=socket_available_gib,
        kv_bytes_per_token=kv_bytes_per_token,
        context=context,
    )


def _check_counts(max_num_seqs: int | None, max_model_len: int | None) -> None:
    if max_num_seqs is not None and max_num_seqs < 1:
        raise InputError("must be at least 1", key="max_num_seqs", fix="use 1 or more")
    if max_model_len is not None and max_model_len < 1:
        raise InputError("must be at least 1", key="max_model_len", fix="use a positive length")


class _PoolSize(NamedTuple):
    max_num_seqs: int
    kv_needed_gib: float
    fits: bool
    pool_gib: int
    """Inside the cap when the sequences fit, else the cap."""
    wanted_pool_gib: int
    """What the sequences need with `KV_MARGIN`, in whole GiB, at least `MIN_POOL_GIB`."""


def _size_pool(
    cap: int, kv_bytes_per_token: int, context: int, max_num_seqs: int | None, target_seqs: int
) -> _PoolSize:
    """The sequences and the KV pool inside `cap` (docs/tuning.md rules 2 and 3)."""
    sequence_gib = kv_bytes_per_token * context * (1 + KV_MARGIN) / GIB
    if max_num_seqs is None:
        max_num_seqs = max(1, min(target_seqs, math.floor(max(cap, 0) / sequence_gib)))
    kv_needed = kv_bytes_per_token * context * max_num_seqs / GIB
    fits = cap >= MIN_POOL_GIB and kv_needed <= cap
    wanted_pool = max(MIN_POOL_GIB, math.ceil(sequence_gib * max_num_seqs))
    pool = min(cap, wanted_pool) if fits else cap
    return _PoolSize(max_num_seqs, kv_needed, fits, pool, wanted_pool)


def _memory_fit(
    sized: _PoolSize,
    *,
    cap: int,
    weights: float,
    runtime: float,
    headroom: float,
    available: float,
    kv_bytes_per_token: int,
    context: int,
) -> MemoryFit:
    """The fit and, when it fails, what to change."""
    process = weights + (sized.pool_gib if sized.fits else sized.wanted_pool_gib) + runtime
    suggested, action = _advice(
        fits=sized.fits,
        pool=sized.pool_gib,
        weights=weights,
        runtime=runtime,
        headroom=headroom,
        available=available,
        kv_bytes_per_token=kv_bytes_per_token,
        context=context,
        max_num_seqs=sized.max_num_seqs,
    )
    return MemoryFit(
        weights_gb=round(weights, 2),
        kv_bytes_per_token=kv_bytes_per_token,
        context=context,
        max_num_seqs=sized.max_num_seqs,
        kv_gb=round(sized.kv_needed_gib, 2),
        kv_pool_gb=max(sized.pool_gib, 0),
        kv_pool_cap_gb=max(cap, 0),
        headroom_gb=round(headroom, 2),
        runtime_gb=round(runtime, 2),
        process_gb=round(process, 2),
        required_gb=round(process + headroom, 2),
        available_gb=round(available, 2),
        fits=sized.fits,
        suggested_max_model_len=suggested,
        action=action,
    )


def pool_cap_gib(
    resident: float,
    headroom: float,
    socket_total_gib: float,
    socket_available_gib: float,
    first_node_available_gib: float | None,
) -> int:
    """The most the KV pool may take: the tuner's share, what is free beside what the server
    holds before its pool (`resident`: weights and runtime) and the headroom, and what the
    first node has free beside its share of that."""
    cap = min(kv_pool_gib(socket_total_gib), math.floor(socket_available_gib - resident - headroom))
    if first_node_available_gib is not None and socket_available_gib > 0:
        share = resident * min(1.0, first_node_available_gib / socket_available_gib)
        cap = min(cap, math.floor(first_node_available_gib - share))
    return cap


def _advice(
    *,
    fits: bool,
    pool: int,
    weights: float,
    runtime: float,
    headroom: float,
    available: float,
    kv_bytes_per_token: int,
    context: int,
    max_num_seqs: int,
) -> tuple[int | None, str]:
    if fits:
        return None, "fits"
    if weights + runtime + headroom + MIN_POOL_GIB > available:
        return None, (
            f"the server does not fit in socket memory ({weights:.2f} GiB weights + "
            f"{runtime:.2f} GiB vLLM's own processes + {MIN_POOL_GIB} GiB KV + {headroom:.2f} "
            f"GiB OS headroom = {weights + runtime + MIN_POOL_GIB + headroom:.2f} GiB > "
            f"{available:.2f} GiB available): use a smaller or quantized model, or a socket "
            "with more free memory"
        )
    if pool < MIN_POOL_GIB:
        return None, (
            "the socket's first NUMA node has too little free memory for a KV pool beside the "
            "weights: free memory on that node or use a smaller model"
        )
    pool_bytes = pool * GIB
    longest = pool_bytes // (kv_bytes_per_token * max_num_seqs)
    suggested = int(longest // LENGTH_STEP * LENGTH_STEP)
    most_seqs = int(pool_bytes // (kv_bytes_per_token * context))
    seqs_hint = f" or max_num_seqs to {most_seqs}" if 1 <= most_seqs < max_num_seqs else ""
    if suggested < LENGTH_STEP:
        return None, (
            f"the KV for {max_num_seqs} sequences does not fit the {pool} GiB KV pool even at "
            f"{LENGTH_STEP} tokens: lower max_num_seqs (at most "
            f"{pool_bytes // (kv_bytes_per_token * LENGTH_STEP)} fit at {LENGTH_STEP} tokens)"
        )
    return suggested, (
        f"lower max_model_len to {suggested}{seqs_hint} (the KV pool is {pool} GiB; "
        f"{context} tokens x {max_num_seqs} sequences need more)"
    )
