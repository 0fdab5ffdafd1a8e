"""The Instinct recipe's VRAM fit (docs/instinct.md): per GPU, the weights' share plus a
fixed overhead (activation profiling, HIP graph capture, buffers); what is left holds the KV
cache. >= safe_kv_gb: safe; min_kv_gb..safe_kv_gb: tight, start with --enforce-eager (graph
capture would take 1-2 GB); below min_kv_gb: do not start (the profiling pass would OOM).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from epycd.model.instinct import FitTiers
from epycd.sizes import GIB

FitTier = Literal["safe", "tight", "too_tight", "too_big"]


class GpuFit(BaseModel):
    """One tensor-parallel size on one kind of GPU, GiB per GPU."""

    tensor_parallel_size: int
    vram_gb: float = Field(description="one GPU's VRAM")
    weights_gb: float = Field(description="the weights' share on one GPU")
    overhead_gb: float
    remaining_for_kv_gb: float = Field(description="per GPU, after weights and overhead")
    tier: FitTier


def fit_vram(weights_bytes: int, vram_gb: float, tp: int, tiers: FitTiers) -> GpuFit:
    weights = weights_bytes / GIB / tp
    remaining = vram_gb - weights - tiers.overhead_gb
    if weights > vram_gb - tiers.overhead_gb:
        tier: FitTier = "too_big"
    elif remaining < tiers.min_kv_gb:
        tier = "too_tight"
    elif remaining < tiers.safe_kv_gb:
        tier = "tight"
    else:
        tier = "safe"
    return GpuFit(
        tensor_parallel_size=tp,
        vram_gb=vram_gb,
        weights_gb=round(weights, 2),
        overhead_gb=tiers.overhead_gb,
        remaining_for_kv_gb=round(remaining, 2),
        tier=tier,
    )


def launchable(fit: GpuFit) -> bool:
    return fit.tier in ("safe", "tight")


def smallest_fitting_tp(
    weights_bytes: int, vram_gb: float, sizes: list[int], tiers: FitTiers
) -> GpuFit | None:
    """The smallest power-of-two TP (of `sizes`) whose VRAM holds the model, or None."""
    for tp in sorted(sizes):
        fit = fit_vram(weights_bytes, vram_gb, tp, tiers)
        if launchable(fit):
            return fit
    return None
