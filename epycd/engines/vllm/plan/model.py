"""What a vLLM server's decisions are (`SERVERS`): one instance on CPUs (`VllmCpuServer`:
an endpoint's only server, or one of a set's) or one on Instinct GPUs
(`VllmInstinctServer`); what they share (`VllmService`: which vLLM build serves them and from
where; `VllmProcess`: one `vllm serve` process, typed in its `invocation`), and the one
reader of a record from before the invocation (`pre_invocation_flags`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from epycd.engines.vllm.model.gpu_memory import GpuFit
from epycd.engines.vllm.plan.argv import vllm_argv
from epycd.engines.vllm.plan.invocation import (
    ENFORCE_EAGER_FLAG,
    CpuEngine,
    RocmEngine,
    VllmInvocation,
)
from epycd.model.facts import MemoryFit
from epycd.plan.endpoint import Endpoint
from epycd.plan.invocation_facts import InvocationFacts
from epycd.plan.model import BindMount, CpuPlacement, CpuServer, EngineService, GpuServer, ServerFit
from epycd.spec.flags import ExtraFlags

Backend = Literal["zentorch", "stock", "rocm"]


class VllmService(EngineService):
    """What every vLLM server of an endpoint (one instance, a set's, an Instinct one) shares
    beside the service's fields: which vLLM build serves it, from where, and its container's
    flags."""

    backend: Backend
    image: str | None = Field(description="container image; None on the host path")
    image_entrypoint_is_vllm_serve: bool = False
    vllm_executable: str | None = Field(default=None, description="host path only")
    vllm_version: str
    run_flags: list[str] = Field(default_factory=list, description="container run flags")
    extra_mounts: list[BindMount] = Field(
        default_factory=list, description="containers: local model folder, chat template file"
    )

    @property
    def engine(self) -> str:
        """The engine (`epycd.engines`)."""
        return "vllm"

    @property
    def backend_name(self) -> str:
        """What serves it, for its fingerprint: the backend (zentorch, stock, rocm)."""
        return self.backend


class VllmProcess(InvocationFacts, CpuPlacement):
    """One vLLM process: where it is pinned, its environment, its context and batch, and
    `vllm serve` typed in `invocation`. Its words (`vllm_args`) are made from the invocation
    when they are read, never stored beside it; only a record from before format 3 holds
    them (`recorded_vllm_args`), and its units ran with those words as they are. The fields
    that repeat the invocation (`invocation_facts`) are left out of a record and filled from
    the invocation when it is read."""

    model_config = ConfigDict(serialize_by_alias=True)
    invocation_type: ClassVar[type[BaseModel]] = VllmInvocation

    env: dict[str, str] = Field(description="environment for vLLM; never a secret")
    kv_cache_gb: int
    max_model_len: int
    max_num_seqs: int = Field(description="0: vLLM's default (an Instinct file without one)")
    enforce_eager: bool = Field(
        default=False,
        description="CPU: a host vLLM without a C++ compiler or its interpreter's Python "
        "headers (docs/tuning.md rule 4); Instinct: the VRAM fit's tight tier",
    )
    recorded_vllm_args: list[str] | None = Field(
        default=None,
        validation_alias=AliasChoices("vllm_args", "recorded_vllm_args"),
        serialization_alias="vllm_args",
        exclude_if=lambda words: words is None,
        description="LEGACY: the words after `vllm serve` an approval record of format 1 or 2 "
        "stored (its key: `vllm_args`); None in every plan made since",
    )
    invocation: VllmInvocation | None = Field(
        default=None,
        description="`vllm serve` typed; its words are `vllm_args` (epycd.engines.vllm.plan.argv); "
        "None only in an approval record written before the planner filled it",
    )

    @classmethod
    def invocation_facts(cls, invocation: VllmInvocation) -> dict[str, Any]:
        return {
            "dtype": invocation.dtype,
            "host": invocation.host,
            "port": invocation.port,
            "served_model_name": invocation.served_model_name,
            "max_model_len": invocation.max_model_len,
            "max_num_seqs": invocation.engine.max_num_seqs or 0,
            "enforce_eager": invocation.engine.enforce_eager,
        }

    @model_validator(mode="after")
    def _has_words(self) -> Self:
        if self.invocation is None and self.recorded_vllm_args is None:
            raise ValueError("a vLLM process needs its invocation (or a record's vllm_args)")
        return self

    @property
    def vllm_args(self) -> list[str]:
        """The arguments after `vllm serve`, model first: the invocation's words, or those a
        record of an earlier format stored, as its approved units ran them."""
        if self.recorded_vllm_args is not None:
            return list(self.recorded_vllm_args)
        assert self.invocation is not None
        return vllm_argv(self.invocation)

    @property
    def runs_eager(self) -> bool:
        """vLLM runs eager: the invocation's (the plan's rule 4, or --enforce-eager in the
        endpoint file's words); a record from before the invocation says it in
        `enforce_eager` or, for the file's flag, in its words only (`pre_invocation_flags`)."""
        if self.invocation is not None:
            return self.invocation.eager
        return self.enforce_eager or pre_invocation_flags(self).given(ENFORCE_EAGER_FLAG)


class VllmCpuServer(CpuServer, VllmService, VllmProcess):
    """One vLLM server on CPUs: an endpoint's only server, or one of a set's."""

    kind: Literal["cpu"] = "cpu"
    set_kind: ClassVar[str] = "set"
    omp_cpus: str = Field(
        description="VLLM_CPU_OMP_THREADS_BIND: the pinned set without the front end's first "
        "core(s) (docs/tuning.md rule 1)"
    )
    max_num_batched_tokens: int
    memory: MemoryFit = Field(description="the fit in the NUMA nodes' RAM")

    @classmethod
    def invocation_facts(cls, invocation: VllmInvocation) -> dict[str, Any]:
        engine = invocation.engine
        assert isinstance(engine, CpuEngine), engine.kind
        return super().invocation_facts(invocation) | {
            "omp_cpus": engine.omp_cpus,
            "max_num_batched_tokens": engine.max_num_batched_tokens,
        }

    @classmethod
    def nested_invocation_facts(cls, invocation: VllmInvocation) -> dict[str, dict[str, Any]]:
        """The memory fit was computed at the invocation's context and sequences."""
        return {
            "memory": {
                "context": invocation.max_model_len,
                "max_num_seqs": invocation.engine.max_num_seqs,
            }
        }

    @property
    def cpu_fit(self) -> ServerFit:
        return self.memory


class VllmInstinctServer(GpuServer, VllmService, VllmProcess):
    """One vLLM server on Instinct GPUs, an endpoint's only server (docs/instinct.md); its
    CPUs are the GPUs' NUMA node(s), for the host side of the engine."""

    kind: Literal["instinct"] = "instinct"
    gpus: list[int] = Field(description="the GPU indices (HIP_VISIBLE_DEVICES)")
    gfx_version: str | None = Field(default=None, description="the GPUs' gfx target")
    tensor_parallel_size: int = 1
    gpu_fit: GpuFit = Field(description="the VRAM fit per GPU")

    @classmethod
    def invocation_facts(cls, invocation: VllmInvocation) -> dict[str, Any]:
        engine = invocation.engine
        assert isinstance(engine, RocmEngine), engine.kind
        return super().invocation_facts(invocation) | {
            "tensor_parallel_size": engine.tensor_parallel_size
        }


def pre_invocation_flags(decisions: VllmProcess) -> ExtraFlags:
    """LEGACY: the one reader of decisions without `invocation`, approval records written
    before it (eras E1-E13, tests/approval/records) and hand-made decisions. Such a record
    holds `vllm serve`'s words and no typed invocation, so the KV pool's bytes flag, the
    endpoint file's own flags and an --enforce-eager given by the file are in those words and
    nowhere else: they are read with the one grammar of flags (epycd.spec.flags). Decisions
    with `invocation` are read from its fields; the renderer emits either's words as stored."""
    return ExtraFlags.of(decisions.vllm_args)


AnyVllmServer = VllmCpuServer | VllmInstinctServer
"""One vLLM server, on CPUs or on GPUs: the decisions of one process its unit runs."""


def vllm_processes(decisions: Endpoint) -> list[AnyVllmServer]:
    """The endpoint's vLLM processes; none for another engine's endpoint."""
    return [s for s in decisions.servers if isinstance(s, VllmCpuServer | VllmInstinctServer)]


SERVERS = (VllmCpuServer, VllmInstinctServer)
