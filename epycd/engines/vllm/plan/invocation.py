"""One vLLM instance's invocation, typed: what `vllm serve` is told, as fields and before any word
of argv. The planner fills it (`serve_invocation`, from decide_cpu and decide_gpu) and stores
it as each process's `invocation`; `epycd.engines.vllm.plan.argv` is the only builder of its
words (`vllm_argv`, `bench_engine_argv`).

Nothing in the product reads an argv back: the renderer's checks, the boot check and
`epycctl bench` read these fields. A record from before the field renders from its stored
`vllm_args`, and `epycd.plan.model.pre_invocation_flags`, the one legacy reader, reads
its words for what only they hold. tests/render/argv_records.py derives invocations from
argv to check `vllm_argv` against every planned and stored case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from epycd.spec.flags import ExtraFlags

if TYPE_CHECKING:
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
RUNNER_FLAG = "--runner"
"""`vllm serve --runner {auto,draft,generate,pooling}` (vLLM 0.32.0's --help)."""
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
    aliases: list[str] = Field(default_factory=list, exclude_if=lambda names: not names)
    """More names it answers to (`--served-model-name NAME ALIAS...`); left out of a record
    when empty."""
    revision: str | None = None
    chat_template: str | None = None
    runner: Literal["pooling"] | None = None
    """vLLM's pooling runner, for an embedder or a reranker; None: its own choice (`auto`),
    or the endpoint file's `--runner`."""
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
    pooling: bool = False,
) -> VllmInvocation:
    """The planner's invocation of one instance: where the endpoint file has it listen, its
    revision and template, the pooling runner for a `pooling` model, and its extra_args,
    around the engine the planner decided."""
    return VllmInvocation(
        model_arg=model_arg,
        dtype=dtype,
        max_model_len=context,
        host=spec.host,
        port=port,
        served_model_name=served,
        aliases=list(spec.aliases),
        revision=spec.revision or None,
        chat_template=spec.chat_template or None,
        runner="pooling" if pooling and not spec.extra_flags.given(RUNNER_FLAG) else None,
        extra=spec.extra_flags,
        engine=engine,
    )
