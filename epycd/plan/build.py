"""Planning every endpoint file together: spec + host + model + stack -> decisions -> units.

`plan_all` gathers what needs the outside world (endpoint files, model facts, a host vLLM
probe, listening ports, the HF cache folder) through functions it is given, so tests and the
daemon can pass their own; everything after that is pure. Endpoints are planned together so
that they get disjoint sockets (or NUMA node groups) and distinct ports; one endpoint's
error never stops another.

The start timeout is `base_s + per_weights_gib_s x weights GiB` (data/epyc.json): loading
reads the weights from disk and the first request compiles, a minute or two on a CPU.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from epycd.errors import EpycError, Refusal
from epycd.host.cpulist import format_cpulist
from epycd.host.facts import HostFacts
from epycd.listen import is_loopback
from epycd.model.facts import MemoryFit, ModelFacts
from epycd.model.footprint import runtime_gib
from epycd.model.memory import fit_memory
from epycd.names import INSTANCE_SEPARATOR, unit_name
from epycd.paths import endpoint_status_file
from epycd.plan import tuning
from epycd.plan.alloc import Placement, PlacementRequest, allocate
from epycd.plan.fingerprint import fingerprint, fingerprint_inputs, inputs_fingerprint
from epycd.plan.gpu import GpuPlacement
from epycd.plan.healing import healing_for
from epycd.plan.hfcache import host_hf_home, resolve_hf_cache
from epycd.plan.homes import home_read_paths
from epycd.plan.instances import Region
from epycd.plan.model import (
    BindMount,
    EndpointDecisions,
    Healing,
    HfCacheMount,
    Plan,
    PrimaryEndpoint,
    Problem,
    Restart,
    Runtime,
    UnitRenderer,
)
from epycd.plan.ports import Listener, PortRequest, assign_ports, listening_ports
from epycd.plan.prepare import (
    ModelInspector,
    Prepared,
    VllmProber,
    memoized_sources,
    prepare_all,
    with_embedded_runtime,
)
from epycd.plan.result import EndpointResult, failed
from epycd.plan.route import Route
from epycd.plan.unit_commands import approval_check_argv
from epycd.settings import Settings, trusted_admin_gid
from epycd.sizes import GIB
from epycd.spec import EndpointSpec, SpecResult, consent_reasons, load_endpoints
from epycd.stack import Stack, shipped_stack


def exposure_reason(spec: EndpointSpec, port: int) -> str | None:
    """The consent an endpoint reachable from other machines without an API key needs."""
    if is_loopback(spec.host) or spec.api_key_file is not None:
        return None
    return (
        f"it listens on {spec.host} port {port}, reachable beyond this machine, with no API "
        "key: anyone who reaches the port can use the model (set api_key_file to require a "
        'key, or host = "127.0.0.1" to keep it local)'
    )


def _first_node(host: HostFacts, placement: Placement, bind: list[int]) -> int:
    """The node of the first bound CPU: vLLM allocates the KV pool there."""
    first_cpu = min(bind or placement.cpus)
    for node in placement.numa_nodes:
        if first_cpu in host.node(node).cpus:
            return node
    return placement.numa_nodes[0]


@dataclass(frozen=True)
class NodeMemory:
    """The memory of an instance's NUMA nodes, its share of them, in GiB."""

    node_count: int
    total: float
    available: float
    first: int
    """The node of the first bound CPU, where vLLM allocates the KV pool."""
    first_available: float


def node_memory(
    host: HostFacts, placement: Placement, bind: list[int], memory_share: float
) -> NodeMemory:
    nodes = [host.node(n) for n in placement.numa_nodes]
    first = _first_node(host, placement, bind)
    return NodeMemory(
        node_count=len(nodes),
        total=sum(n.memory_total_bytes for n in nodes) / GIB * memory_share,
        available=sum(n.memory_available_bytes for n in nodes) / GIB * memory_share,
        first=first,
        first_available=host.node(first).memory_available_bytes / GIB * memory_share,
    )


def _model_size_warnings(spec: EndpointSpec, facts: ModelFacts) -> list[str]:
    warnings = []
    positions = facts.max_position_embeddings
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
    most_batched = batched_tokens(spec, target, spec.max_num_seqs or target.max_num_seqs)
    runtime, footprint_warnings = runtime_gib(
        prepared.route.vllm_version, facts.weights_bytes or 0, most_batched
    )
    warnings += footprint_warnings
    fit = fit_memory(
        weights_bytes=facts.weights_bytes or 0,
        kv_bytes_per_token=facts.kv_bytes_per_token,
        max_position_embeddings=facts.max_position_embeddings,
        max_model_len=spec.max_model_len or stack.defaults.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        socket_total_gib=memory.total,
        socket_available_gib=memory.available,
        runtime_gib=runtime,
        first_node_available_gib=memory.first_available,
        target_seqs=target.max_num_seqs,
    )
    if fewer := _fewer_seqs_warning(spec, placement, target, fit, memory):
        warnings.append(fewer)
    return fit, warnings


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


def build_env(
    prepared: Prepared, stack: Stack, sizing: Sizing, kv_gib: int, hf: HfCacheMount | None
) -> dict[str, str]:
    env = {"VLLM_CPU_OMP_THREADS_BIND": format_cpulist(sizing.bind)}
    if not sizing.kv_bytes_flag:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)
    if prepared.spec.throughput_flags:
        env.update(stack.throughput_flags)
    if prepared.route.runtime == "host" and hf is not None:
        env["HF_HOME"] = host_hf_home(hf)
    env.update(prepared.spec.env)
    return env


def host_home_paths(route: Route, model: str, chat_template: str | None) -> list[str]:
    if route.runtime != "host" or route.vllm_executable is None:
        return []
    local = [path for path in (model, chat_template) if path and path.startswith("/")]
    return home_read_paths(route.vllm_executable, local)


BATCHED_TOKENS_FLAG = "--max-num-batched-tokens"
STREAM_INTERVAL_FLAG = "--stream-interval"


def user_flag(extra_args: list[str], flag: str) -> str | None:
    """The value the endpoint file's extra_args give `flag` (`--flag V` or `--flag=V`)."""
    for index, arg in enumerate(extra_args):
        if arg == flag and index + 1 < len(extra_args):
            return extra_args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def batched_tokens(spec: EndpointSpec, target: tuning.BatchTarget, seqs: int) -> int:
    """Rule 2's size, or the endpoint file's own `--max-num-batched-tokens` in extra_args."""
    given = user_flag(spec.extra_args, BATCHED_TOKENS_FLAG)
    return int(given) if given and given.isdecimal() else tuning.batched_tokens(target, seqs)


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
    spec, route = prepared.spec, prepared.route
    bind = tuning.omp_bind(placement.cpus)
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


def _sized(
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
        batched_tokens=batched_tokens(prepared.spec, target, fit.max_num_seqs),
        kv_bytes_flag=tuning.kv_bytes_flag(prepared.route.vllm_version),
        enforce_eager=eager,
        stream_interval=tuning.stream_interval(prepared.spec.profile, prepared.route.vllm_version),
    )
    return sizing, fit, memory_warnings + compile_warnings


def _bind_mounts(
    spec: EndpointSpec, model: str, containerized: bool
) -> tuple[list[BindMount], str]:
    """A container's view of a local model folder and a chat template file, and the model
    argument vLLM gets there (the folder's real path)."""
    mounts: list[BindMount] = []
    model_arg = model
    if model.startswith("/") and containerized:
        real = os.path.realpath(model)
        mounts.append(BindMount(host_path=real, container_path=real))
        model_arg = real
    if spec.chat_template and containerized:
        template = os.path.realpath(spec.chat_template)
        mounts.append(BindMount(host_path=template, container_path=spec.chat_template))
    return mounts, model_arg


def _hf_cache_warnings(hf: HfCacheMount | None, containerized: bool) -> list[str]:
    warnings = []
    if hf is not None and containerized and not os.path.isdir(hf.host_path):
        warnings.append(
            f"the HF cache {hf.host_path} does not exist yet: create it (mkdir -p) before the "
            "container starts, or set HF_HOME to the cache that holds the model"
        )
    if hf is not None and not containerized and host_hf_home(hf) != hf.host_path:
        warnings.append(
            f"the HF cache {hf.host_path} is out of the endpoint's reach (it runs as the user "
            f"epyc-llm, without access to /root and /home): it uses {host_hf_home(hf)}; "
            "set HF_HOME to a cache outside them to share one"
        )
    if hf is not None and hf.on_nfs:
        warnings.append(
            f"the HF cache {hf.host_path} is on a network filesystem: root-squash can deny "
            "the container; use a local disk or export it without root_squash"
        )
    return warnings


def start_timeout_s(stack: Stack, facts: ModelFacts) -> int:
    """TimeoutStartSec: the stack's base and its seconds per GiB of weights."""
    weights_gib = (facts.weights_bytes or 0) / GIB
    return (
        stack.start_timeout.base_s + math.ceil(weights_gib) * stack.start_timeout.per_weights_gib_s
    )


@dataclass(frozen=True)
class ServedModel:
    """What an endpoint serves and how vLLM finds it, by one rule for CPU and Instinct GPU."""

    model: str
    served: str
    """--served-model-name: the file's, else the endpoint's name for a local folder."""
    dtype: str
    model_arg: str
    """vLLM's model argument: a local folder's real path, as a container sees it."""
    mounts: list[BindMount]
    hf: HfCacheMount | None
    """The HF cache; None for a local model folder."""
    containerized: bool


def served_model(
    prepared: Prepared, stack: Stack, hf_cache: HfCacheMount, containerized: bool
) -> ServedModel:
    spec = prepared.spec
    model = spec.model or stack.default_model
    local = model.startswith("/")
    mounts, model_arg = _bind_mounts(spec, model, containerized)
    return ServedModel(
        model=model,
        served=spec.served_model_name or (prepared.result.name if local else model),
        dtype=spec.dtype or stack.default_dtype,
        model_arg=model_arg,
        mounts=mounts,
        hf=hf_cache if not local else None,
        containerized=containerized,
    )


class ServedFields(TypedDict):
    """The decisions on what an endpoint serves and from where (`served_fields`)."""

    endpoint: str
    unit_name: str
    config_file: str
    model: str
    model_revision: str | None
    served_model_name: str
    model_kind: str
    primary_endpoint: PrimaryEndpoint
    runtime: Runtime
    image: str | None
    image_entrypoint_is_vllm_serve: bool
    vllm_version: str
    dtype: str
    hf_cache: HfCacheMount | None
    extra_mounts: list[BindMount]
    hf_token_file: str | None
    api_key_file: str | None
    chat_template: str | None


def served_fields(prepared: Prepared, chosen: ServedModel) -> ServedFields:
    """The decisions of `ServedFields`, the same for a CPU and an Instinct GPU endpoint."""
    spec, route, facts = prepared.spec, prepared.route, prepared.facts
    name = prepared.result.name
    chat = facts.primary_endpoint == "chat_completions"
    primary: PrimaryEndpoint = "chat_completions" if chat else "completions"
    return ServedFields(
        endpoint=name,
        unit_name=unit_name(name),
        config_file=str(prepared.result.path),
        model=chosen.model,
        model_revision=facts.revision,
        served_model_name=chosen.served,
        model_kind=facts.support.kind,
        primary_endpoint=primary,
        runtime=route.runtime,
        image=route.image,
        image_entrypoint_is_vllm_serve=route.image_entrypoint_is_vllm_serve,
        vllm_version=route.vllm_version,
        dtype=chosen.dtype,
        hf_cache=chosen.hf if chosen.containerized else None,
        extra_mounts=chosen.mounts,
        hf_token_file=spec.hf_token_file,
        api_key_file=spec.api_key_file,
        chat_template=spec.chat_template,
    )


@dataclass(frozen=True)
class Placed:
    """Where an endpoint runs, on which port, and what its placement and device add to its
    warnings and to the consent it needs (from a CPU `Placement` or a `GpuPlacement`)."""

    socket: int
    numa_nodes: list[int]
    port: int
    warnings: list[str]
    """The placement's and the sizing's, before the HF cache's."""
    device_warnings: list[str]
    """The device's own, after the HF cache's."""
    confirmation_reasons: list[str] = field(default_factory=list)


class ServiceFields(TypedDict):
    """The decisions on how an endpoint's service runs and what it must say
    (`service_fields`)."""

    socket: int
    numa_nodes: list[int]
    port: int
    host: str
    profile: tuning.Profile
    limit_nofile: int
    limit_memlock: str
    restart: Restart
    healing: Healing
    start_timeout_s: int
    podman_notify_healthy: bool
    product_python: str
    exec_condition: list[list[str]]
    status_file: str
    requires_confirmation: bool
    confirmation_reasons: list[str]
    warnings: list[str]


def service_fields(
    prepared: Prepared,
    chosen: ServedModel,
    placed: Placed,
    host: HostFacts,
    stack: Stack,
    product_python: str,
    status_file: str,
) -> ServiceFields:
    """The decisions of `ServiceFields`, the same for a CPU and an Instinct GPU endpoint:
    the warnings of the route, the model, `placed`, the HF cache, then the device's own."""
    spec, route = prepared.spec, prepared.route
    warnings = [*route.warnings, *prepared.warnings, *placed.warnings]
    warnings += _hf_cache_warnings(chosen.hf, chosen.containerized) + placed.device_warnings
    reasons = [*route.confirmation_reasons, *placed.confirmation_reasons]
    reasons += consent_reasons(spec.extra_args, spec.env)
    if exposed := exposure_reason(spec, placed.port):
        reasons.append(exposed)
    start_s = start_timeout_s(stack, prepared.facts)
    return ServiceFields(
        socket=placed.socket,
        numa_nodes=placed.numa_nodes,
        port=placed.port,
        host=spec.host,
        profile=spec.profile,
        limit_nofile=tuning.LIMIT_NOFILE,
        limit_memlock=tuning.LIMIT_MEMLOCK,
        restart=spec.restart,
        healing=healing_for(spec.restart, start_s, supervised=route.runtime != "podman"),
        start_timeout_s=start_s,
        podman_notify_healthy=route.runtime == "podman" and host.runtimes.podman.notify_healthy,
        product_python=product_python,
        exec_condition=[approval_check_argv(product_python, prepared.result.name)],
        status_file=status_file,
        requires_confirmation=bool(reasons),
        confirmation_reasons=reasons,
        warnings=warnings,
    )


def _stock_notes(prepared: Prepared) -> list[str]:
    if prepared.spec.throughput_flags and prepared.route.backend == "stock":
        return ["ZENTORCH_WEIGHT_PREPACK has no effect on the stock vLLM path"]
    return []


def decide(
    prepared: Prepared,
    *,
    host: HostFacts,
    stack: Stack,
    placement: Placement,
    port: int,
    hf_cache: HfCacheMount,
    product_python: str,
    status_file: str,
    memory_share: float = 1.0,
) -> EndpointDecisions:
    """Every decision for one placed endpoint (or one instance of it, with its share of the
    nodes' memory): sizing, mounts, served name, timeouts."""
    route = prepared.route
    sizing, fit, sized_warnings = _sized(prepared, host, stack, placement, memory_share)
    chosen = served_model(prepared, stack, hf_cache, containerized=route.runtime != "host")
    warnings = [*placement.warnings, *sized_warnings]
    placed = Placed(placement.socket, placement.numa_nodes, port, warnings, _stock_notes(prepared))
    host_hf = chosen.hf if not chosen.containerized else None
    return EndpointDecisions(
        **served_fields(prepared, chosen),
        **service_fields(prepared, chosen, placed, host, stack, product_python, status_file),
        backend=route.backend,
        vllm_executable=route.vllm_executable,
        socket_reason=placement.reason,
        cpus=placement.cpulist,
        omp_cpus=format_cpulist(sizing.bind),
        env=build_env(prepared, stack, sizing, fit.kv_pool_gb, host_hf),
        kv_cache_gb=fit.kv_pool_gb,
        memory=fit,
        max_model_len=fit.context,
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=sizing.batched_tokens,
        enforce_eager=sizing.enforce_eager,
        vllm_args=vllm_args(
            prepared, chosen.model_arg, chosen.served, fit, port, chosen.dtype, sizing
        ),
        run_flags=list(stack.run_flags) if chosen.containerized else [],
        home_read_paths=host_home_paths(route, chosen.model, prepared.spec.chat_template),
    )


def finish(
    prepared: Prepared,
    decisions: EndpointDecisions,
    *,
    host: HostFacts,
    stack: Stack,
    settings: Settings,
    render: UnitRenderer,
) -> Plan:
    """The decisions with their units rendered and fingerprinted."""
    units, dirs = render(decisions, settings.unit_dir, settings.quadlet_dir)
    inputs = _inputs(prepared, stack, host, decisions, units, dirs)
    return Plan(
        **decisions.model_dump(),
        units=units,
        unit_dirs=dirs,
        fingerprint=fingerprint(inputs),
        inputs_fingerprint=inputs_fingerprint(inputs),
    )


def _inputs(
    prepared: Prepared,
    stack: Stack,
    host: HostFacts,
    decisions: EndpointDecisions,
    units: Mapping[str, str],
    dirs: Mapping[str, str],
) -> dict[str, Any]:
    """What an endpoint's fingerprints cover; a refused endpoint has no units."""
    return fingerprint_inputs(
        units=units,
        unit_dirs=dirs,
        spec_sha256=prepared.result.content_sha256,
        stack_sha256=stack.content_sha256,
        model=prepared.facts,
        host=host,
        decisions=decisions,
    )


def _decide_placed(
    prepared: Prepared,
    share: Sharing,
    placement: Placement,
    port: int,
    instances: InstancesInput | None,
) -> EndpointDecisions:
    if instances is not None:
        return instances.decide(prepared, port, share.hf_cache, share.product_python)
    return decide(
        prepared,
        host=share.host,
        stack=share.stack,
        placement=placement,
        port=port,
        hf_cache=share.hf_cache,
        product_python=share.product_python,
        status_file=str(endpoint_status_file(share.settings.run_dir, prepared.result.name)),
    )


def _unfit(
    prepared: Prepared, decisions: EndpointDecisions, host: HostFacts, stack: Stack
) -> EndpointResult:
    """The refusal of an endpoint that does not fit, with its inputs' fingerprint: memory
    short now is no drift of an approved endpoint whose inputs did not change."""
    fit = decisions.memory
    refusal = Refusal(
        f"does not fit: {fit.required_gb} GiB needed (the server's processes "
        f"{fit.process_gb}: weights {fit.weights_gb} + KV pool "
        f"{fit.process_gb - fit.weights_gb - fit.runtime_gb:.0f} + vLLM's own "
        f"{fit.runtime_gb}; OS headroom "
        f"{fit.headroom_gb}), "
        f"{fit.available_gb} GiB available on the socket's NUMA nodes",
        file=prepared.result.path,
        key="max_model_len",
        fix=decisions.memory.action,
    )
    decisions.errors.append(Problem.of(refusal))
    inputs = _inputs(prepared, stack, host, decisions, units={}, dirs={})
    return failed(
        prepared.result,
        refusal,
        model_facts=prepared.facts,
        decisions=decisions,
        unfit_inputs_fingerprint=inputs_fingerprint(inputs),
    )


def plan_result(prepared: Prepared, decisions: EndpointDecisions, share: Sharing) -> EndpointResult:
    """The result of a CPU or an Instinct GPU endpoint's decisions: their plan, or the error
    rendering it raised."""
    try:
        plan = finish(
            prepared,
            decisions,
            host=share.host,
            stack=share.stack,
            settings=share.settings,
            render=share.render,
        )
    except EpycError as exc:
        decisions.errors.append(Problem.of(exc))
        return failed(prepared.result, exc, model_facts=prepared.facts, decisions=decisions)
    return EndpointResult(
        endpoint=prepared.result.name,
        config_file=str(prepared.result.path),
        plan=plan,
        model_facts=prepared.facts,
    )


def _plan_one(
    prepared: Prepared,
    share: Sharing,
    placement: Placement,
    port: int,
    instances: InstancesInput | None = None,
) -> EndpointResult:
    try:
        decisions = _decide_placed(prepared, share, placement, port, instances)
    except EpycError as exc:
        if exc.file is None:
            exc.file = str(prepared.result.path)
        return failed(prepared.result, exc, model_facts=prepared.facts, route=prepared.route)
    if not decisions.memory.fits:
        return _unfit(prepared, decisions, share.host, share.stack)
    return plan_result(prepared, decisions, share)


@dataclass
class Sharing:
    """What the endpoints share out: the host's sockets and ports, and the approvals that
    already hold some of them."""

    host: HostFacts
    stack: Stack
    settings: Settings
    listeners: Mapping[int, Listener]
    approved_sockets: dict[str, int]
    approved_ports: dict[str, int]
    hf_cache: HfCacheMount
    product_python: str
    render: UnitRenderer
    approved_gpus: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class InstancesInput:
    """What an endpoint of several instances needs beyond its placement and port: the
    sockets it may use, the ports others hold (epycd.plan.multi)."""

    share: Sharing
    parts: list[Region]
    taken_ports: set[int]

    def decide(
        self, prepared: Prepared, port: int, hf_cache: HfCacheMount, product_python: str
    ) -> EndpointDecisions:
        from epycd.plan.multi import decide_set

        return decide_set(
            prepared,
            host=self.share.host,
            stack=self.share.stack,
            parts=self.parts,
            port=port,
            taken_ports=self.taken_ports,
            listeners=self.share.listeners,
            hf_cache=hf_cache,
            product_python=product_python,
            run_dir=self.share.settings.run_dir,
        )


def _instances_input(
    prepared: Prepared,
    placement: Placement,
    placements: Mapping[str, Placement | GpuPlacement | EpycError],
    ports: Mapping[str, int | EpycError],
    share: Sharing,
) -> InstancesInput | None:
    """For an endpoint with `instances` other than 1: the sockets and ports around it."""
    from epycd.plan.multi import regions, wants_instances

    name = prepared.result.name
    if not wants_instances(prepared.spec):
        return None
    held = {p.socket for n, p in placements.items() if n != name and isinstance(p, Placement)}
    prefix = name + INSTANCE_SEPARATOR
    own = [n for n in share.approved_sockets if n.startswith(prefix)]
    held |= {s for n, s in share.approved_sockets.items() if n != name and n not in own}
    taken = {p for n, p in ports.items() if n != name and isinstance(p, int)}
    taken |= {p for n, p in share.approved_ports.items() if n != name}
    approved_nodes = {int(n.removeprefix(prefix)) for n in own}
    parts = regions(share.host, prepared.spec, placement, held, approved_nodes)
    return InstancesInput(share, parts, taken)


def _placements(
    ready: list[Prepared], share: Sharing
) -> dict[str, Placement | GpuPlacement | EpycError]:
    """Instinct GPU endpoints placed first (epycd.plan.gpu_build); CPU endpoints get the
    other nodes. Approved endpoints not in `ready` keep their socket."""
    from epycd.plan import gpu_build

    gpu_ready = [p for p in ready if gpu_build.is_gpu(p)]
    gpu_placements = gpu_build.place(gpu_ready, share, share.approved_gpus)
    placements: dict[str, Placement | GpuPlacement | EpycError] = dict(gpu_placements)
    cpu_host = gpu_build.cpu_view(
        share.host, gpu_placements, share.approved_gpus, {p.result.name for p in ready}
    )
    placements |= allocate(
        [
            PlacementRequest(
                p.result.name,
                p.result.path,
                None if p.spec.socket == "auto" else p.spec.socket,
                kept=share.approved_sockets.get(p.result.name),
            )
            for p in ready
            if not gpu_build.is_gpu(p)
        ],
        cpu_host,
        share.stack.defaults.busy_threshold_pct,
        reserved=share.approved_sockets,
    )
    return placements


def _plan_placed(
    prepared: Prepared,
    placements: Mapping[str, Placement | GpuPlacement | EpycError],
    ports: Mapping[str, int | EpycError],
    share: Sharing,
) -> tuple[EndpointResult, bool]:
    """One endpoint's result, and whether it is refused while holding a socket or a port."""
    from epycd.plan import gpu_build

    name = prepared.result.name
    placement, port = placements[name], ports[name]
    failures = [x for x in (placement, port) if isinstance(x, EpycError)]
    if failures:
        refused = failed(
            prepared.result, *failures, model_facts=prepared.facts, route=prepared.route
        )
        return refused, len(failures) < 2
    assert isinstance(port, int)
    if isinstance(placement, GpuPlacement):
        result = gpu_build.plan_one(prepared, share, placement, port)
    else:
        assert isinstance(placement, Placement)
        instances = _instances_input(prepared, placement, placements, ports, share)
        result = _plan_one(prepared, share, placement, port, instances)
    return result, result.plan is None


def place_round(ready: list[Prepared], share: Sharing) -> dict[str, tuple[EndpointResult, bool]]:
    """Place and plan `ready` together: name -> (result, whether a refused endpoint holds a
    socket or a port in it)."""
    placements = _placements(ready, share)
    ports = assign_ports(
        [
            PortRequest(
                p.result.name, p.result.path, None if p.spec.port == "auto" else p.spec.port
            )
            for p in ready
        ],
        share.listeners,
        share.stack.defaults.first_port,
        approved=share.approved_ports,
    )
    return {p.result.name: _plan_placed(p, placements, ports, share) for p in ready}


def place_all(ready: list[Prepared], share: Sharing) -> dict[str, EndpointResult]:
    """Place and plan, then again without the refused endpoints that held a socket or a
    port, so that a refused endpoint takes nothing from the others; a round is kept only
    when every endpoint planned before still plans."""
    fixed: dict[str, EndpointResult] = {}
    current = place_round(ready, share)
    while True:
        takers = {name for name, (_, holds) in current.items() if holds}
        if not takers:
            break
        retry = place_round([p for p in ready if p.result.name not in fixed.keys() | takers], share)
        planned = [name for name, (r, _) in current.items() if r.plan is not None]
        if any(retry[name][0].plan is None for name in planned):
            break
        fixed |= {name: current[name][0] for name in takers}
        current = retry
    return fixed | {name: result for name, (result, _) in current.items()}


def listened_on(
    listeners: Mapping[int, Listener] | None, instance_ports: Mapping[str, list[int]] | None
) -> dict[int, Listener]:
    """The ports listened on here (`listening_ports()` unless `listeners` are given), and the
    instance ports of approved multi-instance endpoints, as if their units listened."""
    held = {
        port: Listener(pid=None, process=f"an instance of approved endpoint {name}", endpoint=name)
        for name, ports in (instance_ports or {}).items()
        for port in ports
    }
    return held | dict(listening_ports() if listeners is None else listeners)


def plan_all(
    settings: Settings,
    host: HostFacts,
    *,
    render: UnitRenderer,
    stack: Stack | None = None,
    specs: list[SpecResult] | None = None,
    inspect: ModelInspector | None = None,
    probe: VllmProber | None = None,
    listeners: Mapping[int, Listener] | None = None,
    environ: Mapping[str, str] | None = None,
    host_root: Path | None = None,
    product_python: str | None = None,
    approved_sockets: Mapping[str, int] | None = None,
    approved_ports: Mapping[str, int] | None = None,
    approved_gpus: Mapping[str, list[int]] | None = None,
    approved_instance_ports: Mapping[str, list[int]] | None = None,
) -> list[EndpointResult]:
    """A result per endpoint file of `settings.config_dir` (or `specs`), in name order.

    `approved_sockets` and `approved_ports` (endpoint -> the socket, the port of its approved
    plan) keep "auto" endpoints where they were approved and keep others off them, running or
    not, so that adding an endpoint file never moves an approved one nor lands on it.
    `render` turns decisions into units (`epycd.render.render_for_plan`, given by the caller).
    `approved_instance_ports` (endpoint -> its instances' ports, docs/instances.md) count as
    listened on by that endpoint: free for it, taken for every other.

    Defaults reach the outside world: the shipped stack, the endpoint files, `inspect_model`
    and `probe_vllm` (both through the probe cache of `settings.run_dir`), the ports
    listening on this machine, `os.environ` for HF_HOME.
    """
    stack = stack or shipped_stack()
    if specs is None:
        specs = load_endpoints(settings.config_dir, precisions=stack.precisions)
    root = host_root or settings.host_root
    inspect, probe = memoized_sources(settings, inspect, probe, root)
    host = with_embedded_runtime(host, settings.runtime_dir, specs, probe)
    secret_group = trusted_admin_gid(settings.daemon_conf)
    results, ready = prepare_all(specs, host, stack, inspect, probe, secret_group)
    share = Sharing(
        host=host,
        stack=stack,
        settings=settings,
        hf_cache=resolve_hf_cache(root, environ or os.environ),
        listeners=listened_on(listeners, approved_instance_ports),
        approved_sockets=dict(approved_sockets or {}),
        approved_ports=dict(approved_ports or {}),
        product_python=product_python or sys.executable,
        render=render,
        approved_gpus=dict(approved_gpus or {}),
    )
    results.update(place_all(ready, share))
    return [results[name] for name in sorted(results)]
