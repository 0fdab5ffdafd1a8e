"""Does a model fit one socket's memory? Pure functions, GiB throughout (2^30 bytes). What
vLLM itself checks, and why the fit is the socket's: docs/tuning.md rule 3, "What vLLM checks"
and "Against the socket, all of it"; the context and KV figures: docs/sources.md, "Model
figures from config.json".

Weights, the KV pool vLLM is given, vLLM's own runtime (its processes beside weights and KV,
measured: `epycd.engines.vllm.model.footprint`, docs/tuning.md rule 7) and the OS
headroom must add up inside the chosen socket's memory (the recipe checked total host RAM
and forgot the pool it pre-allocates). The first three are the server's process tree at its
peak (`process_gb`). This module holds the arithmetic: the context (`context_length`), the
sum against the memory available and what to change when it fails (`fit_memory`). How big
the pool, its cap and the headroom are is the tuner's decision
(`epycd.engines.vllm.plan.tuning`, docs/tuning.md rules 2 and 3), given here as inputs
(`PoolSize`, the cap, the headroom).
"""

from __future__ import annotations

from typing import NamedTuple

from epycd.errors import InputError
from epycd.model.facts import MemoryFit
from epycd.sizes import GIB

DEFAULT_MAX_MODEL_LEN: int | None = None
"""None: the model's full context, which is what `vllm serve` uses without --max-model-len."""
LENGTH_STEP = 256
MIN_POOL_GIB = 1
"""The smallest KV pool: vLLM is given it in whole GiB, and a pool of 0 is none."""


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


def check_counts(max_num_seqs: int | None, max_model_len: int | None) -> None:
    if max_num_seqs is not None and max_num_seqs < 1:
        raise InputError("must be at least 1", key="max_num_seqs", fix="use 1 or more")
    if max_model_len is not None and max_model_len < 1:
        raise InputError("must be at least 1", key="max_model_len", fix="use a positive length")


class PoolSize(NamedTuple):
    """The sequences and the KV pool the tuner chose inside its cap
    (`epycd.engines.vllm.plan.tuning.size_pool`)."""

    max_num_seqs: int
    kv_needed_gib: float
    fits: bool
    pool_gib: int
    """Inside the cap when the sequences fit, else the cap."""
    wanted_pool_gib: int
    """What the sequences need with the tuner's margin, in whole GiB, at least
    `MIN_POOL_GIB`."""


def fit_memory(
    sized: PoolSize,
    *,
    cap: int,
    weights: float,
    runtime: float,
    headroom: float,
    available: float,
    kv_bytes_per_token: int,
    context: int,
) -> MemoryFit:
    """The fit of weights + KV pool + runtime + headroom in the `available` GiB, and what to
    change if it fails: the arithmetic of the pool the tuner sized inside `cap` and of its
    headroom (`epycd.engines.vllm.plan.tuning.kv_pool`). `runtime` is vLLM's own processes
    (`Footprint.runtime_gib`), `weights` the weights in GiB."""
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
