"""llama.cpp's decisions (`DECISIONS`): one llama-server on CPUs (`LlamaEndpoint`), or a set
of them behind one balancer (`LlamaSetEndpoint`), with what both share (`LlamaService`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from epycd.engines.llama_cpp.plan.invocation import LlamaInvocation
from epycd.engines.llama_cpp.plan.sizing import LlamaFit
from epycd.plan.model import BalancedSet, CpuServer, ServerFit
from epycd.sizes import gib


class LlamaService(BaseModel):
    """What a llama.cpp endpoint (one server or a set) has beside every endpoint's fields:
    which llama-server serves which GGUF file."""

    model_config = ConfigDict(frozen=True)

    engine: Literal["llama.cpp"] = "llama.cpp"
    llama_server: str = Field(description="the llama-server executable")
    llama_version: str = Field(description="the llama.cpp source it was built from")
    gguf_file: str = Field(description="the GGUF file's name, as the endpoint file gives it")

    @property
    def image(self) -> str | None:
        """No container image: llama-server runs on the host."""
        return None

    @property
    def vllm_executable(self) -> str | None:
        return None

    @property
    def backend_name(self) -> str:
        """What serves it, for its fingerprint: the engine."""
        return self.engine


class LlamaEndpoint(CpuServer, LlamaService):
    """An endpoint of one llama-server on CPUs, or one member of a llama.cpp set:
    a GGUF file, pinned to one socket's cores and NUMA nodes as a vLLM instance is, sized by
    docs/tuning.md rules 9-10."""

    kind: Literal["llama"] = "llama"
    env: dict[str, str] = Field(
        default_factory=dict, description="llama-server's environment; never a secret"
    )
    fit: LlamaFit = Field(description="the fit of the process in the NUMA nodes' RAM")
    server_args: list[str] = Field(description="arguments after llama-server")
    invocation: LlamaInvocation = Field(description="the server typed; server_args are its words")

    @property
    def cpu_fit(self) -> ServerFit:
        return self.fit

    @property
    def omp_cpus(self) -> str:
        """The cores its threads run on: all of its pinned set."""
        return self.cpus

    @property
    def kv_cache_gb(self) -> float:
        """The KV pool the slots share, GiB."""
        return gib(self.fit.memory.kv_bytes)

    @property
    def max_model_len(self) -> int:
        return self.invocation.context

    @property
    def max_num_seqs(self) -> int:
        return self.invocation.slots


class LlamaSetEndpoint(BalancedSet[LlamaEndpoint], LlamaService):
    """An endpoint of several llama-servers behind one balancer: one per NUMA node (or per
    share of one) as for vLLM (docs/instances.md)."""

    kind: Literal["llama-set"] = "llama-set"

    @property
    def fit(self) -> LlamaFit:
        return self.worst_member.fit


DECISIONS = (LlamaEndpoint, LlamaSetEndpoint)
