"""One vLLM instance's invocation, typed (issue 28, design 2.2): what `vllm serve` is told,
as fields and before any word of argv. The planner fills it (`serve_invocation`, from
decide_cpu and gpu_decide) and stores it as `EndpointDecisions.invocation`;
`epycd.plan.argv` is the only builder of its words (`vllm_argv`, `bench_engine_argv`).

`invocation_from_record` is the one reader of an argv: it derives the invocation of a record
approved before the planner filled the field (its flat decisions and `vllm_args`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from epycd.sizes import GIB
from epycd.spec.flags import ExtraFlags

if TYPE_CHECKING:
    from epycd.plan.model import EndpointDecisions
    from epycd.spec import EndpointSpec

MAX_NUM_SEQS_FLAG = "--max-num-seqs"
BATCHED_TOKENS_FLAG = "--max-num-batched-tokens"
KV_BYTES_FLAG = "--kv-cache-memory-bytes"
ENFORCE_EAGER_FLAG = "--enforce-eager"
STREAM_INTERVAL_FLAG = "--stream-interval"
TENSOR_PARALLEL_FLAG = "--tensor-parallel-size"
EXECUTOR_BACKEND_FLAG = "--distributed-executor-backend"
REVISION_FLAG = "--revision"
CHAT_TEMPLATE_FLAG = "--chat-template"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""Rule 3's legacy form of the pool: whole GiB in the env instead of bytes on argv."""


class CpuEngine(BaseModel):
    """The CPU engine's sizing and compile choice (docs/tuning.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["cpu"] = "cpu"
    omp_cpus: str
    """Rule 1's OpenMP bind list (VLLM_CPU_OMP_THREADS_BIND: the env, not argv)."""
    max_num_seqs: int
    max_num_batched_tokens: int
    """Rule 2's size, or the endpoint file's own when it gives one."""
    pass_batched_tokens: bool = True
    """False: the endpoint file gives --max-num-batched-tokens itself."""
    kv_cache_memory_bytes: int | None = None
    """Rule 3: the KV pool on argv; None: VLLM_CPU_KVCACHE_SPACE (GiB) in the env instead."""
    enforce_eager: bool = False
    """Rule 4: the plan's own --enforce-eager (a host vLLM that cannot compile)."""
    stream_interval: int | None = None
    """Rule 8; None: vLLM's default, a vLLM without the flag, or the file's own."""


class RocmEngine(BaseModel):
    """An Instinct endpoint's engine: the recipe and the GPU placement (docs/instinct.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["rocm"] = "rocm"
    max_num_seqs: int | None = None
    """The endpoint file's max_num_seqs; None: vLLM's default."""
    recipe_args: list[str] = Field(default_factory=list)
    """The Instinct recipe's args (data/instinct-recipes.json), verbatim."""
    tensor_parallel_size: int = 1
    distributed_executor_backend: Literal["mp"] | None = None
    """`mp` for a MoE recipe spread over several GPUs."""
    enforce_eager: bool = False
    """The VRAM fit's "tight" tier: no HIP graph capture."""

    @model_validator(mode="after")
    def _backend_needs_gpus(self) -> Self:
        if self.distributed_executor_backend and self.tensor_parallel_size < 2:
            raise ValueError("an executor backend without tensor parallelism")
        return self

    @property
    def recipe_flags(self) -> ExtraFlags:
        return ExtraFlags.of(self.recipe_args)


Engine = Annotated[CpuEngine | RocmEngine, Field(discriminator="kind")]


class VllmInvocation(BaseModel):
    """`vllm serve` of one instance: the model and its context, the engine, where it listens
    and as what, and the endpoint file's own flags (`extra`, passed last and verbatim)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_arg: str
    """The model as vLLM reads it: a hub id, or the folder's path (inside the container)."""
    dtype: str
    max_model_len: int
    host: str
    port: int
    served_model_name: str
    revision: str | None = None
    chat_template: str | None = None
    extra: ExtraFlags = ExtraFlags()
    engine: Engine
    approved_argv: list[str] | None = None
    """An approved record's own words, which the fields do not give back (a record of an
    older renderer): the renderer emits them as they are; nothing else reads them."""

    @property
    def eager(self) -> bool:
        """vLLM runs eager: the plan's choice, or the endpoint file's (or recipe's) flag."""
        recipe = isinstance(self.engine, RocmEngine) and self.engine.recipe_flags.given(
            ENFORCE_EAGER_FLAG
        )
        return self.engine.enforce_eager or self.extra.given(ENFORCE_EAGER_FLAG) or recipe


def serve_invocation(
    spec: EndpointSpec,
    *,
    model_arg: str,
    served: str,
    dtype: str,
    context: int,
    port: int,
    engine: CpuEngine | RocmEngine,
) -> VllmInvocation:
    """The planner's invocation of one instance: where the endpoint file has it listen, its
    revision and template, and its extra_args, around the engine the planner decided."""
    return VllmInvocation(
        model_arg=model_arg,
        dtype=dtype,
        max_model_len=context,
        host=spec.host,
        port=port,
        served_model_name=served,
        revision=spec.revision or None,
        chat_template=spec.chat_template or None,
        extra=spec.extra_flags,
        engine=engine,
    )


def _after(words: list[str], flag: str) -> str | None:
    """The word after the first `flag` of `words` (the plan's own, exact spelling)."""
    if flag not in words:
        return None
    index = words.index(flag)
    return words[index + 1] if index + 1 < len(words) else None


def invocation_from_record(decisions: EndpointDecisions) -> VllmInvocation:
    """The invocation of one instance's flat decisions: an endpoint's own, or a member's of an
    instance set (a set's own `vllm_args` are its first member's). The fields come from the
    decisions; the argv, as the planner writes it, gives what never was a field. Its
    `approved_argv` is None: for an argv of another shape (a hand-written one, or a record of
    an older renderer) `epycd.plan.argv.vllm_argv` does not give the argv back, and the
    caller keeps it there."""
    argv = list(decisions.vllm_args)
    serving = argv.index("--host") if "--host" in argv else len(argv)
    planned, listen = argv[1:serving], argv[serving + 6 :]
    revision = None
    if listen[:1] == [REVISION_FLAG] and len(listen) > 1:
        revision, listen = listen[1], listen[2:]
    template = decisions.chat_template
    if template is not None and listen[:2] == [CHAT_TEMPLATE_FLAG, template]:
        listen = listen[2:]
    return VllmInvocation(
        model_arg=argv[0] if argv else decisions.model,
        dtype=decisions.dtype,
        max_model_len=decisions.max_model_len,
        host=decisions.host,
        port=decisions.port,
        served_model_name=decisions.served_model_name,
        revision=revision,
        chat_template=template,
        extra=ExtraFlags.of(listen),
        engine=_rocm_engine(decisions, planned)
        if decisions.device == "instinct"
        else _cpu_engine(decisions, planned),
    )


def _cpu_engine(decisions: EndpointDecisions, planned: list[str]) -> CpuEngine:
    interval = _after(planned, STREAM_INTERVAL_FLAG)
    return CpuEngine(
        omp_cpus=decisions.omp_cpus,
        max_num_seqs=decisions.max_num_seqs,
        max_num_batched_tokens=decisions.max_num_batched_tokens,
        pass_batched_tokens=BATCHED_TOKENS_FLAG in planned,
        kv_cache_memory_bytes=None
        if KV_SPACE_ENV in decisions.env
        else decisions.kv_cache_gb * GIB,
        enforce_eager=decisions.enforce_eager,
        stream_interval=int(interval) if interval and interval.isdecimal() else None,
    )


def _rocm_engine(decisions: EndpointDecisions, planned: list[str]) -> RocmEngine:
    """The recipe's args are what lies between the plan's own flags: after the context and
    max_num_seqs, before the tensor-parallel flags and --enforce-eager."""
    rest = planned[4:]
    seqs = decisions.max_num_seqs or None
    if seqs is not None and rest[:2] == [MAX_NUM_SEQS_FLAG, str(seqs)]:
        rest = rest[2:]
    if decisions.enforce_eager and rest[-1:] == [ENFORCE_EAGER_FLAG]:
        rest = rest[:-1]
    tp = decisions.tensor_parallel_size
    backend: Literal["mp"] | None = None
    if tp > 1 and rest[-2:] == [EXECUTOR_BACKEND_FLAG, "mp"]:
        backend, rest = "mp", rest[:-2]
    if tp > 1 and rest[-2:] == [TENSOR_PARALLEL_FLAG, str(tp)]:
        rest = rest[:-2]
    return RocmEngine(
        max_num_seqs=seqs,
        recipe_args=rest,
        tensor_parallel_size=tp,
        distributed_executor_backend=backend,
        enforce_eager=decisions.enforce_eager,
    )
