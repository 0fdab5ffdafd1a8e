"""How many Instinct GPUs a vLLM endpoint spans (docs/instinct.md): its tensor-parallel size,
the file's, else the smallest of the recipe's sizes whose VRAM holds the model with the
recipe's overhead and KV margin (`epycd.engines.vllm.model.gpu_memory`). The core's GPU
placement (`epycd.plan.placement.gpu`) asks it, through `GpuSizer`, for each endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from epycd.engines.vllm.model.gpu_memory import (
    GpuFit,
    fit_vram,
    launchable,
    smallest_fitting_tp,
)
from epycd.errors import EpycError, InputError, Refusal
from epycd.host.facts import GpuFacts
from epycd.model.instinct import InstinctGpus, shipped_gpus
from epycd.plan.placement.gpu import GpuSizer, GpuSizing
from epycd.plan.prepared import Prepared
from epycd.sizes import GIB

QUANTIZED_FIX = (
    "choose a quantized variant (the recipe's fp8/mxfp4 variant, the provider's -FP8/AWQ/GPTQ "
    "checkpoint, or AMD Quark's amd/<model> on Hugging Face) or a smaller model"
)


class TensorParallelSizer(GpuSizer):
    """One vLLM endpoint's tensor-parallel size on a kind of GPU."""

    def __init__(self, prepared: Prepared, data: InstinctGpus | None = None) -> None:
        spec = prepared.spec
        self.file: Path = prepared.result.path
        self.model = prepared.facts.model
        self.weights_bytes = prepared.facts.weights_bytes or 0
        self.tensor_parallel_size = (
            None if spec.tensor_parallel_size == "auto" else spec.tensor_parallel_size
        )
        self.data = data or shipped_gpus()

    def on(self, kind: Sequence[GpuFacts], count: int) -> GpuSizing | EpycError:
        sizes = self.data.tensor_parallel_sizes
        if count not in sizes or self.tensor_parallel_size not in (None, count):
            return InputError(
                f"{count} GPU(s) listed: the tensor parallel size is the number of GPUs, "
                f"one of {', '.join(map(str, sizes))}",
                file=self.file,
                key="gpus",
                fix="list 1, 2, 4 or 8 GPUs, and leave tensor_parallel_size at that number or auto",
            )
        return self._forced(kind, count)

    def smallest(self, kind: Sequence[GpuFacts], free: int) -> GpuSizing | EpycError:
        gpu = kind[0]
        if self.tensor_parallel_size is not None:
            sized = self._forced(kind, self.tensor_parallel_size)
            return sized if isinstance(sized, EpycError) else self._within(sized, gpu, free)
        best = smallest_fitting_tp(
            self.weights_bytes, gpu.vram_gb, self._sizes(kind), self.data.fit
        )
        if best is None:
            largest = fit_vram(
                self.weights_bytes, gpu.vram_gb, max(self._sizes(kind)), self.data.fit
            )
            return Refusal(
                f"too big for all {len(kind)} {gpu.product} GPU(s): {self._text(gpu, largest)}",
                file=self.file,
                key="model",
                fix=QUANTIZED_FIX,
            )
        return self._within(self._sizing(gpu, best), gpu, free)

    def _within(self, sized: GpuSizing, gpu: GpuFacts, free: int) -> GpuSizing | EpycError:
        if sized.count <= free:
            return sized
        return Refusal(
            f"needs tensor parallel size {sized.count}, and only {free} "
            f"{gpu.product} GPU(s) are free (the others serve other endpoints)",
            file=self.file,
            key="gpus",
            fix="remove an endpoint that holds GPUs, or choose a smaller model",
        )

    def _sizes(self, kind: Sequence[GpuFacts]) -> list[int]:
        return [tp for tp in self.data.tensor_parallel_sizes if tp <= len(kind)]

    def _forced(self, kind: Sequence[GpuFacts], tp: int) -> GpuSizing | EpycError:
        """The fit at the size the file (or its GPU list) gives, or the refusal with the size
        that would fit."""
        gpu = kind[0]
        fit = fit_vram(self.weights_bytes, gpu.vram_gb, tp, self.data.fit)
        if launchable(fit):
            return self._sizing(gpu, fit)
        better = smallest_fitting_tp(
            self.weights_bytes, gpu.vram_gb, self._sizes(kind), self.data.fit
        )
        return Refusal(
            f"{self._text(gpu, fit)}: below the {self.data.fit.min_kv_gb:g} GiB the recipe needs",
            file=self.file,
            key="tensor_parallel_size",
            fix=f"set tensor_parallel_size = {better.tensor_parallel_size}"
            if better
            else QUANTIZED_FIX,
        )

    def _text(self, gpu: GpuFacts, fit: GpuFit) -> str:
        return (
            f"{self.model} ({self.weights_bytes / GIB:.1f} GiB of weights) with tensor "
            f"parallel size {fit.tensor_parallel_size} puts {fit.weights_gb:g} GiB on each "
            f"{gpu.product} ({gpu.vram_gb:g} GiB), {fit.remaining_for_kv_gb:g} GiB left for the "
            f"KV cache after {fit.overhead_gb:g} GiB overhead"
        )

    def _sizing(self, gpu: GpuFacts, fit: GpuFit) -> GpuSizing:
        warnings, reasons = [], []
        if gpu.gfx_version not in self.data.validated_gfx:
            reasons.append(f"{gpu.product} is {gpu.gfx_version}: {self.data.unvalidated_note}")
        if fit.tier == "tight":
            warnings.append(
                f"only {fit.remaining_for_kv_gb:g} GiB per GPU is left for the KV cache (under "
                f"{self.data.fit.safe_kv_gb:g}): started with --enforce-eager, as HIP graph "
                "capture could run out of memory"
            )
        return GpuSizing(
            count=fit.tensor_parallel_size,
            fit=fit,
            warnings=warnings,
            confirmation_reasons=reasons,
        )
