"""Every decision for one placed CPU endpoint, or one instance of a set (`decide`): its
sizing (`sizing.py`), the fields every endpoint shares (`epycd.plan.service.served`), its
OpenMP bind and env (`build_env`), its typed vLLM invocation (`cpu_invocation`; its words by
`argv.py`) and the paths under /root and /home a host endpoint reads (`host_home_paths`)."""

from __future__ import annotations

from epycd.engines.vllm.plan.invocation import (
    BATCHED_TOKENS_FLAG,
    STREAM_INTERVAL_FLAG,
    CpuEngine,
    VllmInvocation,
    serve_invocation,
)
from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.engines.vllm.plan.route import VllmRoute, vllm_route_fields
from epycd.engines.vllm.plan.sizing import Sizing, size
from epycd.host.cpulist import format_cpulist
from epycd.host.facts import HostFacts
from epycd.model.facts import MemoryFit
from epycd.plan.model import HfCacheMount
from epycd.plan.placement.alloc import Placement
from epycd.plan.prepared import Prepared
from epycd.plan.service.hfcache import host_hf_home
from epycd.plan.service.homes import home_read_paths
from epycd.plan.service.served import (
    Placed,
    ServedModel,
    served_fields,
    served_model,
    service_fields,
)
from epycd.sizes import GIB
from epycd.stack import Stack


def build_env(
    prepared: Prepared, stack: Stack, sizing: Sizing, kv_gib: int, hf: HfCacheMount | None
) -> dict[str, str]:
    env = {"VLLM_CPU_OMP_THREADS_BIND": format_cpulist(sizing.bind)}
    if not sizing.kv_bytes_flag:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib)
    if prepared.spec.throughput_flags:
        env.update(stack.throughput_flags)
    if prepared.route_of(VllmRoute).runtime == "host" and hf is not None:
        env["HF_HOME"] = host_hf_home(hf)
    env.update(prepared.spec.env)
    return env


def cpu_invocation(
    prepared: Prepared, chosen: ServedModel, fit: MemoryFit, sizing: Sizing, port: int
) -> VllmInvocation:
    """The CPU engine of docs/tuning.md's rules, a flag the endpoint file gives itself left
    to the file (in any spelling of its grammar, `epycd.spec.flags`)."""
    extra = prepared.spec.extra_flags
    interval = None if prepared.facts.pooling else sizing.stream_interval
    engine = CpuEngine(
        omp_cpus=format_cpulist(sizing.bind),
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=sizing.batched_tokens,
        pass_batched_tokens=not extra.given(BATCHED_TOKENS_FLAG),
        kv_cache_memory_bytes=fit.kv_pool_gb * GIB if sizing.kv_bytes_flag else None,
        enforce_eager=sizing.enforce_eager,
        stream_interval=interval if interval and not extra.given(STREAM_INTERVAL_FLAG) else None,
    )
    return serve_invocation(
        prepared.spec,
        model_arg=chosen.model_arg,
        served=chosen.served,
        dtype=chosen.dtype,
        context=fit.context,
        port=port,
        engine=engine,
        pooling=prepared.facts.pooling,
    )


def host_home_paths(route: VllmRoute, model: str, chat_template: str | None) -> list[str]:
    if route.runtime != "host" or route.vllm_executable is None:
        return []
    local = [path for path in (model, chat_template) if path and path.startswith("/")]
    return home_read_paths(route.vllm_executable, local)


def _stock_notes(prepared: Prepared) -> list[str]:
    if prepared.spec.throughput_flags and prepared.route_of(VllmRoute).backend == "stock":
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
) -> VllmCpuServer:
    """Every decision for one placed endpoint (or one instance of it, with its share of the
    nodes' memory): sizing, mounts, served name, timeouts."""
    route = prepared.route_of(VllmRoute)
    sizing, fit, sized_warnings = size(prepared, host, stack, placement, memory_share)
    chosen = served_model(prepared, stack, hf_cache, containerized=route.runtime != "host")
    warnings = [*placement.warnings, *sized_warnings]
    placed = Placed(placement.socket, placement.numa_nodes, port, warnings, _stock_notes(prepared))
    host_hf = chosen.hf if not chosen.containerized else None
    invocation = cpu_invocation(prepared, chosen, fit, sizing, port)
    service = {
        **served_fields(prepared, chosen),
        **vllm_route_fields(route),
        **service_fields(prepared, chosen, placed, host, stack, product_python, status_file),
    }
    return VllmCpuServer(
        **(service | VllmCpuServer.invocation_facts(invocation)),
        backend=route.backend,
        vllm_executable=route.vllm_executable,
        socket_reason=placement.reason,
        cpus=placement.cpulist,
        env=build_env(prepared, stack, sizing, fit.kv_pool_gb, host_hf),
        kv_cache_gb=fit.kv_pool_gb,
        memory=fit,
        invocation=invocation,
        run_flags=list(stack.run_flags) if chosen.containerized else [],
        home_read_paths=host_home_paths(route, chosen.model, prepared.spec.chat_template),
    )
