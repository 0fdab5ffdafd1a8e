"""The `vllm serve` arguments of an endpoint: a CPU endpoint's (`vllm_args`, from its fit and
sizing) and the ones every endpoint's end with, CPU or Instinct GPU (`serving_args`). Kept
together, apart from the decisions, until argv building moves to the renderer (issue 28)."""

from __future__ import annotations

from epycd.model.facts import MemoryFit
from epycd.plan.prepare import Prepared
from epycd.plan.sizing import BATCHED_TOKENS_FLAG, Sizing, user_flag
from epycd.sizes import GIB
from epycd.spec import EndpointSpec

STREAM_INTERVAL_FLAG = "--stream-interval"


def vllm_args(
    prepared: Prepared,
    model_arg: str,
    served: str,
    fit: MemoryFit,
    port: int,
    dtype: str,
    sizing: Sizing,
) -> list[str]:
    spec = prepared.spec
    args = [model_arg, "--dtype", dtype, "--max-model-len", str(fit.context)]
    args += ["--max-num-seqs", str(fit.max_num_seqs)]
    if user_flag(spec.extra_args, BATCHED_TOKENS_FLAG) is None:
        args += [BATCHED_TOKENS_FLAG, str(sizing.batched_tokens)]
    if sizing.kv_bytes_flag:
        args += ["--kv-cache-memory-bytes", str(fit.kv_pool_gb * GIB)]
    if sizing.enforce_eager:
        args.append("--enforce-eager")
    if sizing.stream_interval and user_flag(spec.extra_args, STREAM_INTERVAL_FLAG) is None:
        args += [STREAM_INTERVAL_FLAG, str(sizing.stream_interval)]
    return args + serving_args(spec, port, served)


def serving_args(spec: EndpointSpec, port: int, served: str) -> list[str]:
    """The arguments every endpoint's `vllm serve` ends with, CPU or GPU: where it listens,
    the served name, the revision and template, then the file's own extra_args."""
    args = ["--host", spec.host, "--port", str(port), "--served-model-name", served]
    if spec.revision:
        args += ["--revision", spec.revision]
    if spec.chat_template:
        args += ["--chat-template", spec.chat_template]
    return args + list(spec.extra_args)
