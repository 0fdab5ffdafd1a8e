"""`epycctl plan NAME`: the plan as the recipe's confirmation table, and the units it would
write. NAME is planned together with every other endpoint file (sockets and ports are
shared), but only NAME is shown. Nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from epycd.cli.options import SAMPLE_SECONDS, NonEmptyPath
from epycd.cli.output import EXIT_OK, json_option, print_json, table
from epycd.errors import InputError
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import HostFacts
from epycd.model.facts import MemoryFit
from epycd.plan.current import LOAD_SAMPLE_SECONDS
from epycd.plan.model import (
    BalancedSet,
    CpuEndpoint,
    CpuServer,
    EndpointDecisions,
    InstanceSetEndpoint,
    InstinctEndpoint,
    LlamaEndpoint,
    LlamaService,
    LlamaSetEndpoint,
    SetEndpoint,
)
from epycd.plan.result import EndpointResult
from epycd.settings import load_settings
from epycd.sizes import gib
from epycd.text import escaped, escaped_lines

JSON_KEYS = (
    "endpoint",
    "model",
    "model_kind",
    "primary_endpoint",
    "backend",
    "runtime",
    "image",
    "vllm_executable",
    "vllm_version",
    "dtype",
    "socket",
    "socket_reason",
    "cpus",
    "omp_cpus",
    "numa_nodes",
    "env",
    "kv_cache_gb",
    "memory",
    "port",
    "host",
    "api_key_file",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "profile",
    "enforce_eager",
    "served_model_name",
    "vllm_args",
    "requires_confirmation",
    "confirmation_reasons",
    "warnings",
)
MEMORY_KEYS = (
    "weights_gb",
    "kv_gb",
    "kv_pool_gb",
    "kv_pool_cap_gb",
    "runtime_gb",
    "process_gb",
    "headroom_gb",
    "required_gb",
    "available_gb",
)


INSTANCE_KEYS = (
    "socket",
    "socket_reason",
    "cpus",
    "omp_cpus",
    "numa_nodes",
    "env",
    "kv_cache_gb",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
    "vllm_args",
)
"""The keys of one vLLM process: a set has no single value for `env`, `vllm_args`,
`max_num_batched_tokens` and `enforce_eager` (null; each member has its own), and shows
the union of its members' CPUs and nodes, the socket they share (null across sockets), and
its tightest member's context, batch and KV pool."""
GPU_KEYS = ("gpus", "gfx_version", "tensor_parallel_size")
LLAMA_KEYS = ("llama_server", "llama_version", "gguf_file", "server_args")
KIND_KEYS = (
    "kind",
    "device",
    "engine",
    "restart",
    "healing",
    *GPU_KEYS,
    "vram",
    "instances",
    *LLAMA_KEYS,
)
"""Keys after `JSON_KEYS`: what kind of endpoint and which engine serves it, how it heals, an
Instinct endpoint's GPUs and VRAM fit (null on CPUs), a set's instances (null for one
instance), a llama.cpp endpoint's server (null for vLLM's)."""


def memory_json(fit: MemoryFit) -> dict[str, Any]:
    dumped = fit.model_dump(mode="json")
    keys = (*MEMORY_KEYS, "fits", "suggested_max_model_len", "action")
    return {key: dumped[key] for key in keys}


def decisions_json(decided: EndpointDecisions) -> dict[str, Any]:
    """The plan keys of decisions, by kind (docs/architecture.md, "Plan keys")."""
    dumped = decided.model_dump(mode="json")
    data: dict[str, Any] = {key: dumped.get(key) for key in (*JSON_KEYS, *KIND_KEYS)}
    data.update(
        kind=decided.kind,
        device="instinct" if isinstance(decided, InstinctEndpoint) else "cpu",
        engine="llama.cpp" if isinstance(decided, LlamaService) else "vllm",
    )
    if isinstance(decided, LlamaSetEndpoint):
        data.update({key: getattr(decided, key, None) for key in INSTANCE_KEYS})
        data["memory"] = decided.fit.model_dump(mode="json")
        data["instances"] = instances_json(decided)
        return data
    if isinstance(decided, LlamaEndpoint):
        data.update(
            kv_cache_gb=decided.kv_cache_gb,
            max_model_len=decided.max_model_len,
            max_num_seqs=decided.max_num_seqs,
            memory=dumped["fit"],
        )
        return data
    if isinstance(decided, InstanceSetEndpoint):
        data.update({key: getattr(decided, key, None) for key in INSTANCE_KEYS})
        data["memory"] = memory_json(decided.memory)
        data["instances"] = instances_json(decided)
        return data
    if isinstance(decided, InstinctEndpoint):
        data.update({key: dumped[key] for key in GPU_KEYS}, vram=dumped["gpu_fit"])
        data.update(omp_cpus=None, max_num_batched_tokens=None, memory=None)
        return data
    data["memory"] = memory_json(decided.memory)
    return data


def instances_json(decided: SetEndpoint) -> dict[str, Any]:
    """A set's layout, its balancer, and each member as a whole instance (its own port,
    CPUs, nodes, env and args)."""
    chosen = decided.instances
    return {
        "requested": chosen.requested,
        "placement": chosen.placement,
        "count": chosen.count,
        "min_ready": chosen.min_ready,
        "reasons": chosen.reasons,
        "balancer": {
            "kind": chosen.balancer,
            "unit_name": decided.unit_name,
            "host": decided.host,
            "port": decided.port,
        },
        # the members' typed invocation is not a plan key: their vllm_args (server_args)
        # are its words
        "members": [m.model_dump(mode="json", exclude={"invocation"}) for m in chosen.members],
    }


def plan_json(result: EndpointResult) -> dict[str, Any]:
    """The `plan` keys (docs/architecture.md, "Plan keys"); keys not decided (refused early)
    are null."""
    decided = result.plan.decisions if result.plan is not None else result.decisions
    data: dict[str, Any] = dict.fromkeys((*JSON_KEYS, *KIND_KEYS))
    data["endpoint"] = result.endpoint
    if decided is not None:
        data.update(decisions_json(decided))
    else:
        if result.model_facts is not None:
            data["model"] = result.model_facts.model
            data["model_kind"] = result.model_facts.support.kind
            data["primary_endpoint"] = result.model_facts.primary_endpoint
        if result.route is not None:
            data.update(result.route.json_keys())
    data["errors"] = [problem.text for problem in result.errors]
    data["units"] = result.plan.units if result.plan else {}
    data["unit_dirs"] = result.plan.unit_dirs if result.plan else {}
    data["fingerprint"] = result.plan.fingerprint if result.plan else None
    return data


def _backend_text(decided: EndpointDecisions) -> str:
    if isinstance(decided, LlamaService):
        return f"llama.cpp {decided.llama_version} (llama-server built for this CPU)"
    if decided.backend == "zentorch":
        return "zentorch acceleration (Zen4+)"
    if decided.backend == "rocm":
        return "ROCm vLLM on AMD Instinct GPUs (docs/instinct.md)"
    return "stock vLLM CPU, no zentorch (no acceleration; verified on Milan)"


def _path_text(decided: EndpointDecisions) -> str:
    if isinstance(decided, LlamaService):
        return f"host llama-server ({decided.llama_server}), {decided.gguf_file}"
    if decided.runtime == "host":
        return f"host vLLM {decided.vllm_version} ({decided.vllm_executable})"
    return f"container ({decided.runtime}, {decided.image})"


def _hardware_text(host: HostFacts) -> str:
    return (
        f"EPYC {host.epyc_generation} ({host.zen_arch or 'unknown Zen'}), "
        f"{host.physical_cores} cores, {host.sockets} socket(s), "
        f"AVX-512 {'yes' if host.avx512 else 'no'}, "
        f"AVX-512 BF16 {'yes' if host.avx512_bf16 else 'no'}"
    )


def _instance_rows(decided: EndpointDecisions) -> list[tuple[str, str]]:
    """A multi-instance endpoint: the balancer, why this many, and each instance's place."""
    if not isinstance(decided, BalancedSet):
        return []
    chosen = decided.instances
    rows = [
        (
            "Instances",
            f"{chosen.count} (instances = {chosen.requested}, placement {chosen.placement}, "
            f"ready with {chosen.min_ready}) behind HAProxy on {decided.host}:{decided.port}",
        )
    ]
    rows += [("Instances why", reason) for reason in chosen.reasons]
    for member in chosen.members:
        rows.append(
            (
                f"Instance {member.instance}",
                f"{member.unit_name}: socket {member.socket}, NUMA "
                f"{','.join(map(str, member.numa_nodes))}, pinned {member.cpus}, "
                f"{_member_threads(member)}, port {member.port}, KV {member.kv_cache_gb} GB, "
                f"{_member_batch(member)} ({member.socket_reason})",
            )
        )
    return rows


def _member_threads(member: CpuServer) -> str:
    if isinstance(member, LlamaEndpoint):
        return f"{member.invocation.threads} threads"
    front = sorted(set(parse_cpulist(member.cpus)) - set(parse_cpulist(member.omp_cpus)))
    return f"OpenMP {member.omp_cpus}, front end {format_cpulist(front) or 'shares the core'}"


def _member_batch(member: CpuServer) -> str:
    if isinstance(member, LlamaEndpoint):
        return f"{member.max_num_seqs} slots, context {member.max_model_len}"
    return f"max_num_seqs {member.max_num_seqs}"


def confirmation_table(result: EndpointResult, host: HostFacts) -> str:
    decided = result.plan.decisions if result.plan is not None else result.decisions
    rows: list[tuple[str, str]] = []
    if decided is not None:
        rows += [
            ("Model / kind", f"{decided.model} -- {decided.model_kind}"),
            ("Endpoint", f"/v1/{decided.primary_endpoint.replace('_', '/')}"),
            ("Backend", _backend_text(decided)),
            ("Path", _path_text(decided)),
            ("Precision", decided.dtype),
        ]
        if isinstance(decided, InstinctEndpoint):
            from epycd.cli.instinct import gpu_rows

            rows += gpu_rows(decided)
        elif isinstance(decided, BalancedSet):
            rows += _set_rows(decided)
        elif isinstance(decided, LlamaEndpoint):
            rows += _llama_rows(decided)
        else:
            rows += _cpu_rows(decided)
        rows += [
            ("Hardware", _hardware_text(host)),
            ("Port", str(decided.port)),
            *_instance_rows(decided),
        ]
        if decided.requires_confirmation:
            rows.append(("Consent needed", "; ".join(decided.confirmation_reasons)))
        rows += [("Warning", text) for text in decided.warnings]
    else:
        if result.model_facts is not None:
            rows.append(("Model / kind", f"{result.model_facts.model} -- "
                         f"{result.model_facts.support.kind}"))  # fmt: skip
        if result.route is not None:
            rows.append(result.route.path_row())
        rows.append(("Hardware", f"{host.cpu_model} ({host.vendor})"))
    rows += [("Error", problem.text) for problem in result.errors]
    return table(rows, header=("Item", "Value"))


def _set_rows(decided: SetEndpoint) -> list[tuple[str, str]]:
    """A set's fit and context are its tightest member's (each member's own are in its
    row); its CPUs and nodes are all of its members'."""
    worst = decided.worst_member
    fit, cpu, context = _llama_rows(worst) if isinstance(worst, LlamaEndpoint) else _cpu_rows(worst)
    where = "across sockets" if decided.socket is None else f"socket {decided.socket}"
    omp = f", OpenMP bind {decided.omp_cpus}" if isinstance(decided, InstanceSetEndpoint) else ""
    return [
        (fit[0], f"tightest instance ({worst.instance}): {fit[1]}"),
        (
            cpu[0],
            f"{where} ({decided.socket_reason}), pinned {decided.cpus}{omp}, memory bound to "
            f"NUMA nodes {','.join(map(str, decided.numa_nodes))}",
        ),
        (context[0], f"tightest instance ({worst.instance}): {context[1]}"),
    ]


def _llama_rows(decided: LlamaEndpoint) -> list[tuple[str, str]]:
    fit, memory, server = decided.fit, decided.fit.memory, decided.invocation
    return [
        (
            "Memory fit",
            f"required {fit.required_gb} GB (server {fit.process_gb}: weights "
            f"{gib(memory.weights_bytes)} + repacked {gib(memory.repacked_bytes)} + KV "
            f"{gib(memory.kv_bytes)} + compute {gib(memory.compute_bytes)}; OS headroom "
            f"{fit.headroom_gb}), available {fit.available_gb} GB on the socket's nodes: "
            f"{'fits' if fit.fits else 'does NOT fit'}",
        ),
        (
            "CPU config",
            f"socket {decided.socket} ({decided.socket_reason}), pinned {decided.cpus}, "
            f"{server.threads} threads, memory bound to NUMA nodes "
            f"{','.join(map(str, decided.numa_nodes))}, weights {server.load_mode}",
        ),
        (
            "Context",
            f"{server.slots} slots sharing one KV pool of {server.context} tokens, prompt "
            f"cache {server.cache_ram_mib} MiB "
            f"(profile {decided.profile})",
        ),
    ]


def _cpu_rows(decided: CpuEndpoint) -> list[tuple[str, str]]:
    fit = decided.memory
    return [
        (
            "Memory fit",
            f"required {fit.required_gb} GB (server {fit.process_gb}: weights "
            f"{fit.weights_gb} + KV pool {fit.kv_pool_gb} + vLLM's processes "
            f"{fit.runtime_gb}; OS headroom {fit.headroom_gb}), available {fit.available_gb}"
            f" GB on the socket's nodes: {'fits' if fit.fits else 'does NOT fit'}",
        ),
        (
            "CPU config",
            f"socket {decided.socket} ({decided.socket_reason}), pinned {decided.cpus}, "
            f"OpenMP bind {decided.omp_cpus} (the rest is the front end's), "
            f"KV {decided.kv_cache_gb} GB (in socket), memory bound to NUMA nodes "
            f"{','.join(map(str, decided.numa_nodes))}",
        ),
        (
            "Context",
            f"max_model_len {decided.max_model_len}, max_num_seqs {decided.max_num_seqs}, "
            f"max_num_batched_tokens {decided.max_num_batched_tokens} "
            f"(profile {decided.profile}"
            f"{', eager: no C++ compiler or Python headers' if decided.enforce_eager else ''})",
        ),
    ]


def show(result: EndpointResult, host: HostFacts) -> None:
    click.echo(escaped(f"Plan for endpoint {result.endpoint} ({result.config_file})") + "\n")
    click.echo(confirmation_table(result, host))
    if result.plan is None:
        return
    for file_name, text in result.plan.units.items():
        folder = result.plan.unit_dirs.get(file_name, "")
        click.echo(escaped_lines(f"\n# {Path(folder) / file_name}\n{text.rstrip()}"))
    click.echo(f"\nfingerprint {result.plan.fingerprint}")
    if result.plan.decisions.requires_confirmation:
        click.echo(f"approve with: epycctl approve {result.endpoint} --accept-unvalidated")
    else:
        click.echo(f"approve with: epycctl approve {result.endpoint}")


@click.command("plan")
@click.argument("name")
@json_option("print the plan as JSON")
@click.option(
    "--root",
    type=NonEmptyPath(path_type=Path, file_okay=False),
    default=None,
    help="host root to read /proc and /sys from (default EPYCD_HOST_ROOT, /)",
)
@click.option(
    "--sample-seconds",
    type=SAMPLE_SECONDS,
    default=LOAD_SAMPLE_SECONDS,
    show_default=True,
    help="interval of the two /proc/stat samples that measure each socket's load",
)
def plan(name: str, as_json: bool, root: Path | None, sample_seconds: float) -> None:
    """Show what NAME's endpoint file would run, and the units, without writing anything."""
    from epycd.approval.record import approved_plans
    from epycd.plan.current import endpoint_specs, plan_endpoints
    from epycd.render import render_for_plan

    settings = load_settings()
    specs = endpoint_specs(settings)
    if name not in {spec.name for spec in specs}:
        raise InputError(
            f"no endpoint file {name}.toml",
            file=settings.config_dir,
            fix=f"create {settings.config_dir / (name + '.toml')} (examples in etc/)",
        )
    results, host = plan_endpoints(
        settings,
        approved_plans(settings),
        render=render_for_plan,
        specs=specs,
        host_root=root,
        sample_seconds=sample_seconds,
    )
    result = next(r for r in results if r.endpoint == name)
    if as_json:
        print_json(plan_json(result))
    else:
        show(result, host)
    if result.exit_code != EXIT_OK:
        raise SystemExit(result.exit_code)
