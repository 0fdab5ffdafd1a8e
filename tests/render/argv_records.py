"""The invocation of flat decisions read back from their argv: the test-side reader that
holds `epycd.engines.vllm.plan.argv.vllm_argv` word for word to the planner's argv and to the stored
records (tests/render/test_argv.py). The product never parses an argv."""

from __future__ import annotations

from typing import Literal

from epycd.engines.vllm.plan.invocation import (
    BATCHED_TOKENS_FLAG,
    CHAT_TEMPLATE_FLAG,
    ENFORCE_EAGER_FLAG,
    EXECUTOR_BACKEND_FLAG,
    KV_SPACE_ENV,
    MAX_NUM_SEQS_FLAG,
    REVISION_FLAG,
    RUNNER_FLAG,
    STREAM_INTERVAL_FLAG,
    TENSOR_PARALLEL_FLAG,
    CpuEngine,
    RocmEngine,
    VllmInvocation,
)
from epycd.engines.vllm.plan.model import AnyVllmServer, VllmCpuServer, VllmInstinctServer
from epycd.sizes import GIB
from epycd.spec.flags import ExtraFlags


def _after(words: list[str], flag: str) -> str | None:
    """The word after the first `flag` of `words` (the plan's own, exact spelling)."""
    if flag not in words:
        return None
    index = words.index(flag)
    return words[index + 1] if index + 1 < len(words) else None


def invocation_from_record(decisions: AnyVllmServer) -> VllmInvocation:
    """The invocation of one instance's flat decisions: an endpoint's own, or a member's of an
    instance set. The fields come from the
    decisions; the argv, as the planner writes it, gives what never was a field. Its
    `approved_argv` is None: for an argv of another shape (a hand-written one, or a record of
    an older renderer) `epycd.engines.vllm.plan.argv.vllm_argv` does not give the argv back, and the
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
        runner="pooling" if _after(planned, RUNNER_FLAG) == "pooling" else None,
        extra=ExtraFlags.of(listen),
        engine=_rocm_engine(decisions, planned)
        if isinstance(decisions, VllmInstinctServer)
        else _cpu_engine(decisions, planned),
    )


def _cpu_engine(decisions: VllmCpuServer, planned: list[str]) -> CpuEngine:
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


def _rocm_engine(decisions: VllmInstinctServer, planned: list[str]) -> RocmEngine:
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
