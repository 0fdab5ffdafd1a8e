"""vLLM's words from the typed invocation (epycd.engines.vllm.plan.invocation): the only builder of
`vllm serve`'s arguments and of the engine arguments `vllm bench throughput` shares with them.
Pure. The planner stores `vllm_argv(invocation)` as the decisions' `vllm_args` (the words of
the record); the renderer and `epycctl bench` call it too. It lives in the plan layer, beside
the type, so that the planner and the layers above share this one builder without the plan
importing render (tests/test_layers.py).

`vllm serve` (after `serve`):

    CPU     MODEL --dtype D --max-model-len N [--runner pooling] --max-num-seqs S
            [--max-num-batched-tokens B]
            [--kv-cache-memory-bytes K] [--enforce-eager] [--stream-interval I] SERVING
    Instinct MODEL --dtype D --max-model-len N [--max-num-seqs S] RECIPE...
            [--tensor-parallel-size T [--distributed-executor-backend mp]] [--enforce-eager]
            SERVING
    SERVING --host H --port P --served-model-name NAME [--revision R] [--chat-template T]
            EXTRA... (the endpoint file's extra_args, verbatim)
"""

from __future__ import annotations

from epycd.engines.vllm.plan.invocation import (
    BATCHED_TOKENS_FLAG,
    CHAT_TEMPLATE_FLAG,
    ENFORCE_EAGER_FLAG,
    EXECUTOR_BACKEND_FLAG,
    KV_BYTES_FLAG,
    MAX_NUM_SEQS_FLAG,
    REVISION_FLAG,
    RUNNER_FLAG,
    STREAM_INTERVAL_FLAG,
    TENSOR_PARALLEL_FLAG,
    CpuEngine,
    RocmEngine,
    VllmInvocation,
)
from epycd.spec.flags import ExtraFlags, names

BENCH_ENGINE_FLAGS = (
    "--dtype",
    "--max-model-len",
    MAX_NUM_SEQS_FLAG,
    BATCHED_TOKENS_FLAG,
    KV_BYTES_FLAG,
    REVISION_FLAG,
)
"""The endpoint's sizing `vllm bench throughput` runs with, as `vllm serve` gets it."""
SERVE_ONLY_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "--tool-parser-plugin")
"""An Instinct recipe's flags that only `vllm serve`'s API server reads (tool calling):
`vllm bench throughput` takes the engine's flags and refuses these."""


def vllm_argv(inv: VllmInvocation) -> list[str]:
    """`vllm serve`'s arguments after `serve`; an approved record's own words as they are."""
    if inv.approved_argv is not None:
        return list(inv.approved_argv)
    engine = inv.engine
    args = [inv.model_arg, "--dtype", inv.dtype, "--max-model-len", str(inv.max_model_len)]
    args += _runner_args(inv)
    args += _cpu_args(engine) if isinstance(engine, CpuEngine) else _rocm_args(engine)
    return args + _serving_args(inv)


def _runner_args(inv: VllmInvocation) -> list[str]:
    return [] if inv.runner is None else [RUNNER_FLAG, inv.runner]


def _cpu_args(engine: CpuEngine) -> list[str]:
    args = [MAX_NUM_SEQS_FLAG, str(engine.max_num_seqs)]
    if engine.pass_batched_tokens:
        args += [BATCHED_TOKENS_FLAG, str(engine.max_num_batched_tokens)]
    if engine.kv_cache_memory_bytes is not None:
        args += [KV_BYTES_FLAG, str(engine.kv_cache_memory_bytes)]
    if engine.enforce_eager:
        args.append(ENFORCE_EAGER_FLAG)
    if engine.stream_interval is not None:
        args += [STREAM_INTERVAL_FLAG, str(engine.stream_interval)]
    return args


def _rocm_args(engine: RocmEngine) -> list[str]:
    args = [] if engine.max_num_seqs is None else [MAX_NUM_SEQS_FLAG, str(engine.max_num_seqs)]
    args += engine.recipe_args
    if engine.tensor_parallel_size > 1:
        args += [TENSOR_PARALLEL_FLAG, str(engine.tensor_parallel_size)]
    if engine.distributed_executor_backend is not None:
        args += [EXECUTOR_BACKEND_FLAG, engine.distributed_executor_backend]
    if engine.enforce_eager:
        args.append(ENFORCE_EAGER_FLAG)
    return args


def _serving_args(inv: VllmInvocation) -> list[str]:
    """Where it listens, the served name, the revision and template, then the file's words."""
    args = ["--host", inv.host, "--port", str(inv.port), "--served-model-name"]
    args += [inv.served_model_name, *inv.aliases]
    if inv.revision is not None:
        args += [REVISION_FLAG, inv.revision]
    if inv.chat_template is not None:
        args += [CHAT_TEMPLATE_FLAG, inv.chat_template]
    return args + list(inv.extra.words)


def bench_engine_argv(inv: VllmInvocation) -> list[str]:
    """The engine arguments of `vllm bench throughput` (`epycctl bench --offline`): the model
    and the sizing the endpoint serves with (`BENCH_ENGINE_FLAGS`), in `vllm serve`'s order,
    a sizing flag of the endpoint file's included; on Instinct the recipe's engine flags (all
    but `SERVE_ONLY_FLAGS`), the tensor parallel size and the executor backend; then
    --enforce-eager when vLLM runs eager."""
    engine = inv.engine
    args = ["--model", inv.model_arg, "--dtype", inv.dtype]
    args += ["--max-model-len", str(inv.max_model_len), *_runner_args(inv)]
    if isinstance(engine, CpuEngine):
        args += [MAX_NUM_SEQS_FLAG, str(engine.max_num_seqs)]
        if engine.pass_batched_tokens:
            args += [BATCHED_TOKENS_FLAG, str(engine.max_num_batched_tokens)]
        if engine.kv_cache_memory_bytes is not None:
            args += [KV_BYTES_FLAG, str(engine.kv_cache_memory_bytes)]
    else:
        if engine.max_num_seqs is not None:
            args += [MAX_NUM_SEQS_FLAG, str(engine.max_num_seqs)]
        args += _engine_words(engine.recipe_flags)
        if engine.tensor_parallel_size > 1:
            args += [TENSOR_PARALLEL_FLAG, str(engine.tensor_parallel_size)]
        if engine.distributed_executor_backend is not None:
            args += [EXECUTOR_BACKEND_FLAG, engine.distributed_executor_backend]
    if inv.revision is not None:
        args += [REVISION_FLAG, inv.revision]
    args += bench_sizing_argv(inv.extra)
    return args + ([ENFORCE_EAGER_FLAG] if inv.eager else [])


def _engine_words(flags: ExtraFlags) -> list[str]:
    """The words of `flags` but the `SERVE_ONLY_FLAGS` and their values."""
    dropped = set()
    for flag in flags.flags:
        if any(names(flag.name, serve_only) for serve_only in SERVE_ONLY_FLAGS):
            dropped.add(flag.position)
            if flag.value is not None and "=" not in flags.words[flag.position]:
                dropped.add(flag.position + 1)
    return [word for index, word in enumerate(flags.words) if index not in dropped]


def bench_sizing_argv(flags: ExtraFlags) -> list[str]:
    """The `BENCH_ENGINE_FLAGS` the words give a whole value, each spelled as vLLM names it."""
    args = []
    for flag in flags.flags:
        named = [f for f in BENCH_ENGINE_FLAGS if names(flag.name, f)]
        if len(named) == 1 and flag.key is None and flag.value is not None:
            args += [named[0], flag.value]
    return args
