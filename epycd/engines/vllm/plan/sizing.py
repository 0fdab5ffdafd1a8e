"""One endpoint's (or one instance's) sizing on its placement (`size`): the tuning rules of
docs/tuning.md (`tune`: OpenMP bind, the profile's batch target, compile or eager; the
batched tokens, `batched_tokens`) and the memory fit of its NUMA nodes (`size_memory`),
with their warnings. vLLM allocates the KV pool on the node of the first bound CPU
(`epycd.plan.placement.alloc.node_memory`).

The memory fit is one step, `fit_request` (vLLM's own processes at the batch, then
`fit_socket`: the tuner's pool and headroom, `epycd.engines.vllm.plan.tuning.kv_pool`, and the
arithmetic, `epycd.engines.vllm.model.memory.fit_memory`), which the plan, the instance layout and
`epycctl estimate` all call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epycd.engines.vllm.model.footprint import runtime_gib
from epycd.engines.vllm.model.memory import check_counts, context_length, fit_memory
from epycd.engines.vllm.plan import tuning
from epycd.engines.vllm.plan.invocation import BATCHED_TOKENS_FLAG
from epycd.engines.vllm.plan.route import VllmRoute
from epycd.engines.vllm.plan.tuning import omp_bind
from epycd.host.facts import HostFacts
from epycd.model.facts import MemoryFit, ModelFacts
from epycd.plan.placement.alloc import NodeMemory, Placement, node_memory
from epycd.plan.prepared import Prepared
from epycd.sizes import GIB
from epycd.spec import EndpointSpec
from epycd.spec.flags import ExtraFlags
from epycd.stack import Stack


def longest_input(facts: ModelFacts) -> int | None:
    """The most tokens a sequence may hold: the positions, or an embedder's or reranker's
    input limit where vLLM derives a lower one (`ModelFacts.max_input_tokens`)."""
    return facts.max_input_tokens or facts.max_position_embeddings


def _model_size_warnings(spec: EndpointSpec, facts: ModelFacts) -> list[str]:
    warnings = []
    positions = longest_input(facts)
    if spec.max_model_len and positions and spec.max_model_len > positions:
        warnings.append(f"max_model_len {spec.max_model_len} is capped to the model's {positions}")
    if facts.weights_bytes is None:
        warnings.append("the weights' size is unknown: the fit counts KV and headroom only")
    return warnings


def _fewer_seqs_warning(
    spec: EndpointSpec,
    placement: Placement,
    target: tuning.BatchTarget,
    fit: MemoryFit,
    memory: NodeMemory,
) -> str | None:
    """Why the fit admits fewer sequences than the profile's target, when it does."""
    if not fit.fits or spec.max_num_seqs is not None or fit.max_num_seqs >= target.max_num_seqs:
        return None
    first, first_available, available = memory.first, memory.first_available, memory.available
    by_node = memory.node_count > 1 and first_available < available - (fit.weights_gb or 0) - 1
    where = (
        f"vLLM allocates the KV pool on NUMA node {first}, the node of the first bound "
        f"CPU, which has {first_available:.1f} GiB free"
        if by_node
        else f"the KV pool may take {fit.kv_pool_cap_gb} GiB of the "
        f"{available:.1f} GiB available on NUMA node(s) "
        f"{','.join(map(str, placement.numa_nodes))}"
    )
    return (
        f"max_num_seqs is {fit.max_num_seqs}, not the {spec.profile} profile's "
        f"{target.max_num_seqs}: {where}, {fit.context}-token sequences; a shorter "
        "max_model_len admits more"
    )


def fit_socket(
    *,
    weights_bytes: int,
    kv_bytes_per_token: int,
    max_position_embeddings: int | None,
    max_model_len: int | None,
    max_num_seqs: int | None,
    socket_total_gib: float,
    socket_available_gib: float,
    runtime_gib: float,
    first_node_available_gib: float | None = None,
    target_seqs: int = 1,
    step_tokens: int | None = None,
) -> MemoryFit:
    """The fit of weights + KV pool + runtime + headroom in one socket (or an instance's
    nodes), and what to change if it fails. `runtime_gib` is vLLM's own processes
    (`Footprint.runtime_gib`).

    `max_num_seqs` None: `target_seqs` (the profile's), or fewer when the pool cap holds fewer
    full-context sequences, never below 1. `first_node_available_gib` is the free memory of
    the socket's first NUMA node; the weights' share on it is taken in proportion to that
    node's part of the socket's free memory. `step_tokens`: a pooling model's batched tokens,
    all its pool holds (`tuning.size_step_pool`).
    """
    check_counts(max_num_seqs, max_model_len)
    context = context_length(max_model_len, max_position_embeddings)
    pool = tuning.kv_pool(
        resident_gib=weights_bytes / GIB + runtime_gib,
        kv_bytes_per_token=kv_bytes_per_token,
        context=context,
        max_num_seqs=max_num_seqs,
        target_seqs=target_seqs,
        socket_total_gib=socket_total_gib,
        socket_available_gib=socket_available_gib,
        first_node_available_gib=first_node_available_gib,
        step_tokens=step_tokens,
    )
    return fit_memory(
        pool.size,
        cap=pool.cap_gib,
        weights=weights_bytes / GIB,
        runtime=runtime_gib,
        headroom=pool.headroom_gib,
        available=socket_available_gib,
        kv_bytes_per_token=kv_bytes_per_token,
        context=context,
    )


@dataclass(frozen=True)
class SizingRequest:
    """What the memory fit of one endpoint (or instance) takes: the model's figures, the
    lengths asked for, the batch target and the memory it may use (GiB). The plan makes it
    from the endpoint file and its nodes (`size_memory`), `epycctl estimate` from its options
    and a socket."""

    vllm_version: str
    weights_bytes: int
    kv_bytes_per_token: int
    max_position_embeddings: int | None
    max_model_len: int | None
    max_num_seqs: int | None
    target: tuning.BatchTarget
    total_gib: float
    available_gib: float
    first_node_available_gib: float | None
    extra_args: Sequence[str] = ()
    """The endpoint file's extra_args: its own `--max-num-batched-tokens` sizes the batch."""
    pooling: bool = False
    """An embedder or a reranker: each input read whole in one step, nothing generated."""


def fit_request(request: SizingRequest) -> tuple[MemoryFit, list[str]]:
    """The fit at vLLM's own processes for the largest batch (`runtime_gib`), and the
    footprint's warnings."""
    seqs = request.max_num_seqs or request.target.max_num_seqs
    whole_input = (
        context_length(request.max_model_len, request.max_position_embeddings)
        if request.pooling
        else None
    )
    most_batched = _batched_tokens(request.extra_args, request.target, seqs, whole_input)
    runtime, warnings = runtime_gib(request.vllm_version, request.weights_bytes, most_batched)
    fit = fit_socket(
        weights_bytes=request.weights_bytes,
        kv_bytes_per_token=request.kv_bytes_per_token,
        max_position_embeddings=request.max_position_embeddings,
        max_model_len=request.max_model_len,
        max_num_seqs=request.max_num_seqs,
        socket_total_gib=request.total_gib,
        socket_available_gib=request.available_gib,
        runtime_gib=runtime,
        first_node_available_gib=request.first_node_available_gib,
        target_seqs=request.target.max_num_seqs,
        step_tokens=most_batched if request.pooling else None,
    )
    return fit, warnings


def size_memory(
    prepared: Prepared,
    host: HostFacts,
    stack: Stack,
    placement: Placement,
    bind: list[int],
    target: tuning.BatchTarget,
    memory_share: float = 1.0,
) -> tuple[MemoryFit, list[str]]:
    """`memory_share`: the part of the nodes' memory the instance may use (instances sharing
    a node each hold their own weights and KV pool, docs/instances.md)."""
    facts, spec = prepared.facts, prepared.spec
    memory = node_memory(host, placement, bind, memory_share)
    warnings = _model_size_warnings(spec, facts)
    fit, footprint_warnings = fit_request(
        SizingRequest(
            vllm_version=prepared.route_of(VllmRoute).vllm_version,
            weights_bytes=facts.weights_bytes or 0,
            kv_bytes_per_token=facts.kv_bytes_per_token,
            max_position_embeddings=longest_input(facts),
            max_model_len=spec.max_model_len or _default_length(facts, stack),
            max_num_seqs=spec.max_num_seqs,
            target=target,
            total_gib=memory.total,
            available_gib=memory.available,
            first_node_available_gib=memory.first_available,
            extra_args=spec.extra_args,
            pooling=facts.pooling,
        )
    )
    warnings += footprint_warnings
    if fewer := _fewer_seqs_warning(spec, placement, target, fit, memory):
        warnings.append(fewer)
    return fit, warnings


def _default_length(facts: ModelFacts, stack: Stack) -> int | None:
    """The stack's context for a generating model; a pooling model's own limit (None: its
    max positions), which is all an input may hold."""
    return None if facts.pooling else stack.defaults.max_model_len


def batched_tokens(
    spec: EndpointSpec, target: tuning.BatchTarget, seqs: int, whole_input: int | None = None
) -> int:
    """Rule 2's size, or the endpoint file's own `--max-num-batched-tokens` in extra_args, in
    any spelling of its grammar (`epycd.spec.flags`). `whole_input`: a pooling model's
    context, which one step must hold (vLLM has no chunked prefill for pooling)."""
    return _batched_tokens(spec.extra_args, target, seqs, whole_input)


def _batched_tokens(
    extra_args: Sequence[str],
    target: tuning.BatchTarget,
    seqs: int,
    whole_input: int | None = None,
) -> int:
    given = ExtraFlags.of(extra_args).value(BATCHED_TOKENS_FLAG)
    if given and given.isdecimal():
        return int(given)
    return max(tuning.batched_tokens(target, seqs), whole_input or 0)


@dataclass(frozen=True)
class Sizing:
    """The tuning decisions of docs/tuning.md for one endpoint, before rendering."""

    bind: list[int]
    target: tuning.BatchTarget
    batched_tokens: int
    kv_bytes_flag: bool
    enforce_eager: bool
    stream_interval: int | None


def tune(
    prepared: Prepared, host: HostFacts, placement: Placement
) -> tuple[list[int], tuning.BatchTarget, bool, list[str]]:
    """Rules 1, 2 and 4: the bind list, the profile's batch target, eager or not."""
    spec, route = prepared.spec, prepared.route_of(VllmRoute)
    bind = omp_bind(placement.cpus, pooling=prepared.facts.pooling)
    target = tuning.batch_target(spec.profile, len(bind))
    eager, warnings = tuning.compile_choice(
        spec.profile,
        host_vllm=route.runtime == "host",
        cxx=host.cxx_compiler,
        headers=prepared.host_vllm.python_headers if prepared.host_vllm else None,
        file=str(prepared.result.path),
        extra_args=list(spec.extra_args),
    )
    return bind, target, eager, warnings


def size(
    prepared: Prepared,
    host: HostFacts,
    stack: Stack,
    placement: Placement,
    memory_share: float = 1.0,
) -> tuple[Sizing, MemoryFit, list[str]]:
    """The tuning rules and the memory fit on the placed socket, and their warnings."""
    bind, target, eager, compile_warnings = tune(prepared, host, placement)
    fit, memory_warnings = size_memory(prepared, host, stack, placement, bind, target, memory_share)
    sizing = Sizing(
        bind=bind,
        target=target,
        batched_tokens=batched_tokens(
            prepared.spec, target, fit.max_num_seqs, fit.context if prepared.facts.pooling else None
        ),
        kv_bytes_flag=tuning.kv_bytes_flag(prepared.route_of(VllmRoute).vllm_version),
        enforce_eager=eager,
        stream_interval=tuning.stream_interval(
            prepared.spec.profile, prepared.route_of(VllmRoute).vllm_version
        ),
    )
    return sizing, fit, memory_warnings + compile_warnings
