"""The CPU's instruction-set class, as the engine choice reads it, and what was measured on
each: vLLM's CPU kernels are built for AVX-512; on a CPU without it (Milan, Rome, Naples) vLLM
runs its AVX2 path, which vLLM itself calls limited (vLLM issue 55613), while llama.cpp's AVX2
kernels are its main ones (docs/tuning.md rule 12)."""

from __future__ import annotations

from typing import Literal, NamedTuple

from epycd.host.facts import HostFacts

InstructionSet = Literal["avx512", "avx2"]


def instruction_set(host: HostFacts) -> InstructionSet:
    return "avx512" if host.avx512 else "avx2"


class Measured(NamedTuple):
    """Output tokens/s of each engine as the product planned it, at one concurrency."""

    concurrency: int
    llama_cpp: float
    vllm: float

    @property
    def times(self) -> int:
        return round(self.llama_cpp / self.vllm)


AVX2_MEASURED: dict[str, Measured] = {
    "latency": Measured(1, 213, 14.8),
    "balanced": Measured(8, 412, 15.8),
    "throughput": Measured(32, 478, 16.2),
}
"""benchmarks/auto-engine-results.md run 3: a Milan VM (Zen 3, 2 cores), the ~100M Llama,
llama.cpp on q8_0 against vLLM's stock path in bf16, at each profile's concurrency."""
AVX2_SPAN = (
    f"{min(m.times for m in AVX2_MEASURED.values())}-"
    f"{max(m.times for m in AVX2_MEASURED.values())}x"
)


def avx2_vllm_warning(host: HostFacts) -> str:
    """Why vLLM is the slow engine on a CPU without AVX-512, for a vLLM endpoint's plan."""
    return (
        f"{host.epyc_generation} has no AVX-512: vLLM runs its AVX2 path, which served "
        f"{AVX2_SPAN} fewer tokens/s than llama.cpp on a Milan (docs/tuning.md rule 12); "
        'engine = "llama.cpp" or "auto" with llama.cpp installed (install.sh --engine '
        "llama.cpp) serves faster here"
    )
