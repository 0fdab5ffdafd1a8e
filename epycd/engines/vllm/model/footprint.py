"""What vLLM's own processes hold beside the weights and the KV pool (docs/tuning.md rule 7).

A served model's process tree holds the weights, the KV pool, and vLLM's own runtime: the API
server, the engine core and its worker each import torch and the tokenizer, the worker keeps a
second copy of the weights while it loads them and the compile workspace of its warm-up. The
runtime is measured, not derived: `benchmarks/memory.py` starts the planned server and records
the peak of the tree's summed PSS per process, and the figures are written, dated and with
their source, to `data/footprint/<vLLM version>.json`. The fit
(`epycd.engines.vllm.model.memory`) counts weights + KV pool + this runtime as the tree's
peak (`process_gb`), and the OS headroom apart.

Which measure: PSS (proportional set size) summed over the tree, not RSS. The three vLLM
processes map the same torch, Python and tokenizer pages; RSS counts them once per process,
the kernel holds them once. PSS divides each shared page among its sharers, so the tree's sum
is what the node must hold for it (docs/tuning.md, "The memory fit").
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from epycd.engines.vllm.model.registry_tables import available_versions, choose_table_version
from epycd.model.tables import data_dir
from epycd.sizes import GIB


class ProcessFootprint(BaseModel):
    """One process of the server: what it holds that is not the weights or the KV pool."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="the process as vLLM titles it (APIServer, EngineCore, ...)")
    gib: float = Field(ge=0, description="its constant part, GiB of PSS at the tree's peak")


class Footprint(BaseModel):
    """vLLM's runtime at one version and backend, as measured (data/footprint/*.json)."""

    model_config = ConfigDict(extra="forbid")

    vllm_version: str
    backend: str = Field(description="the platform vLLM ran on when measured")
    measured: str = Field(description="the date of the measurement, YYYY-MM-DD")
    source: str = Field(description="how it was measured and where the figures are")
    measure: str = Field(description="the memory measure the figures are in")
    processes: list[ProcessFootprint]
    weights_copies: float = Field(
        ge=0, description="extra copies of the weights the tree holds at its peak (loading)"
    )
    per_batched_token_bytes: float = Field(
        ge=0, description="workspace per --max-num-batched-tokens token (profile/compile run)"
    )
    notes: list[str] = Field(default_factory=list)

    def runtime_gib(self, weights_gib: float, batched_tokens: int) -> float:
        """The runtime's peak beside the weights and the KV pool, GiB."""
        constant = sum(process.gib for process in self.processes)
        workspace = self.per_batched_token_bytes * batched_tokens / GIB
        return constant + self.weights_copies * weights_gib + workspace


def footprint_dir() -> Path:
    return data_dir() / "footprint"


def load_footprint(vllm_version: str) -> tuple[Footprint, list[str]]:
    """The measurement for `vllm_version`, else the nearest lower one (with a warning), else
    the lowest one there is (with a warning): an unmeasured version still has a runtime."""
    versions = available_versions(footprint_dir())
    chosen, inexact = choose_table_version(vllm_version, versions)
    if chosen is not None and not inexact:
        return _read(chosen), []
    chosen = chosen or versions[0]
    warning = (
        f"vLLM {vllm_version}'s own memory has not been measured: the fit counts the "
        f"runtime measured with vLLM {chosen} (data/footprint/{chosen}.json)"
    )
    return _read(chosen), [warning]


@cache
def _read(version: str) -> Footprint:
    return Footprint.model_validate_json((footprint_dir() / f"{version}.json").read_text())


def runtime_gib(
    vllm_version: str, weights_bytes: int, batched_tokens: int
) -> tuple[float, list[str]]:
    """vLLM's runtime for a model of `weights_bytes` at `batched_tokens`, GiB, and warnings."""
    footprint, warnings = load_footprint(vllm_version)
    return footprint.runtime_gib(weights_bytes / GIB, batched_tokens), warnings
