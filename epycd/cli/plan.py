"""`epycctl plan NAME`: the plan as the recipe's confirmation table, and the units it would
write. NAME is planned together with every other endpoint file (sockets and ports are
shared), but only NAME is shown. Nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from epycd.cli.engine_view import GPU_KEYS
from epycd.cli.engine_views import view_for, views
from epycd.cli.options import SAMPLE_SECONDS, NonEmptyPath
from epycd.cli.output import EXIT_OK, json_option, print_json, table
from epycd.errors import InputError
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import EndpointDecisions
from epycd.plan.pipeline.current import LOAD_SAMPLE_SECONDS
from epycd.plan.pipeline.result import EndpointResult
from epycd.settings import load_settings
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
    "model_aliases",
    "vllm_args",
    "requires_confirmation",
    "confirmation_reasons",
    "warnings",
)
KIND_KEYS = (
    "kind",
    "device",
    "engine",
    "engine_choice",
    "prerequisite",
    "restart",
    "healing",
    *GPU_KEYS,
    "vram",
    "instances",
    "on_demand",
)
"""Keys after `JSON_KEYS`: what kind of endpoint and which engine serves it, how it heals, an
Instinct endpoint's GPUs and VRAM fit (null on CPUs), a set's instances (null for one
instance), an on-demand endpoint's engine port, idle time and swap group (null for one that
stays up); each engine's own keys follow (`plan_keys`). `engine_choice`: why its engine
serves it (`engine = "auto"`, a converted model), null otherwise; `prerequisite`: what
approve makes before the endpoint can be planned (its model converted), null otherwise."""


def plan_keys() -> tuple[str, ...]:
    """Every key of `plan --json`, in order: each engine's own last (`PlanView.plan_keys`,
    null for the others'). Asked when a plan is printed, not when this module is imported:
    an engine's view may import any command's module."""
    return (*JSON_KEYS, *KIND_KEYS, *(key for view in views() for key in view.plan_keys))


def decisions_json(decided: EndpointDecisions) -> dict[str, Any]:
    """The plan keys of decisions: every endpoint's fields, then its engine's
    (docs/architecture.md, "Plan keys")."""
    dumped = decided.unit_decisions.model_dump(mode="json")
    data: dict[str, Any] = {key: dumped.get(key) for key in plan_keys()}
    data["model_aliases"] = dumped.get("model_aliases", [])  # a record leaves out none
    # the endpoint's own address: an on-demand endpoint's socket, not its engine's port
    data["host"], data["port"] = decided.host, decided.port
    data.update(
        kind=decided.kind,
        device=decided.device,
        engine=decided.engine,
    )
    data.update(view_for(decided.engine).json_keys(decided, dumped))
    return data


def plan_json(result: EndpointResult) -> dict[str, Any]:
    """The `plan` keys (docs/architecture.md, "Plan keys"); keys not decided (refused early)
    are null."""
    decided = result.plan.decisions if result.plan is not None else result.decisions
    data: dict[str, Any] = dict.fromkeys(plan_keys())
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
    if result.prerequisite is not None:
        data["prerequisite"] = result.prerequisite.model_dump(mode="json")
    data["errors"] = [problem.text for problem in result.errors]
    data["units"] = result.plan.units if result.plan else {}
    data["unit_dirs"] = result.plan.unit_dirs if result.plan else {}
    data["fingerprint"] = result.plan.fingerprint if result.plan else None
    return data


def _hardware_text(host: HostFacts) -> str:
    return (
        f"EPYC {host.epyc_generation} ({host.zen_arch or 'unknown Zen'}), "
        f"{host.physical_cores} cores, {host.sockets} socket(s), "
        f"AVX-512 {'yes' if host.avx512 else 'no'}, "
        f"AVX-512 BF16 {'yes' if host.avx512_bf16 else 'no'}"
    )


def _instance_rows(decided: EndpointDecisions) -> list[tuple[str, str]]:
    """A multi-instance endpoint: the balancer, why this many, and each instance's place."""
    chosen = decided.instance_set
    if chosen is None:
        return []
    rows = [
        (
            "Instances",
            f"{chosen.count} (instances = {chosen.requested}, placement {chosen.placement}, "
            f"ready with {chosen.min_ready}) behind HAProxy on {decided.host}:{decided.port}",
        )
    ]
    rows += [("Instances why", reason) for reason in chosen.reasons]
    view = view_for(decided.engine)
    for member in decided.members:
        threads, batch = view.member_text(member)
        rows.append(
            (
                f"Instance {member.instance}",
                f"{member.unit_name}: socket {member.socket}, NUMA "
                f"{','.join(map(str, member.numa_nodes))}, pinned {member.cpus}, "
                f"{threads}, port {member.port}, KV {member.kv_cache_gb} GB, "
                f"{batch} ({member.socket_reason})",
            )
        )
    return rows


def _measured_starts(decided: EndpointDecisions) -> str:
    """What this endpoint's own starts took, as its supervisor counts them since boot
    (`SupervisorStatus.ready_runs`); said as not measured before its first start."""
    from epycd.supervisor import read_status

    path = decided.first.status_file
    said = read_status(Path(path)) if path else None
    if said is None or said.ready_runs < 1:
        return "not measured here yet: its first start measures it"
    average = said.ready_seconds / said.ready_runs
    return f"measured here: {average:.2f} s a start, over its {said.ready_runs} since boot"


def _on_demand_rows(decided: EndpointDecisions) -> list[tuple[str, str]]:
    """An on-demand endpoint: how it starts and stops, its swap group, what a cold request
    waits for (docs/on-demand.md)."""
    on_demand = decided.on_demand
    if on_demand is None:
        return []
    rows = [
        (
            "On demand",
            f"systemd holds {decided.host}:{decided.port}; the first request starts the engine "
            f"on 127.0.0.1:{on_demand.engine_port}, which stops after {on_demand.idle_stop_s} s "
            "with no connection",
        ),
        (
            "Cold request",
            f"waits for the engine's start and health gate ({_measured_starts(decided)}), at "
            f"most {decided.start_timeout_s} s",
        ),
    ]
    others = [name for name in on_demand.swap_group if name != decided.endpoint]
    if others:
        rows.append(
            (
                "Swap group",
                f"{', '.join(on_demand.swap_group)} share these cores and memory, one running at "
                f"a time: a request here stops {', '.join(others)}",
            )
        )
    return rows


def confirmation_table(result: EndpointResult, host: HostFacts) -> str:
    decided = result.plan.decisions if result.plan is not None else result.decisions
    rows: list[tuple[str, str]] = []
    if decided is not None:
        view = view_for(decided.engine)
        rows += [
            ("Model / kind", f"{decided.model} -- {decided.model_kind}"),
            ("Endpoint", f"/v1/{decided.primary_endpoint.replace('_', '/')}"),
            ("Backend", view.backend_text(decided)),
            ("Path", view.path_text(decided)),
            ("Precision", decided.dtype),
            *_engine_choice_rows(decided),
        ]
        if decided.instance_set is not None:
            rows += _set_rows(decided)
        else:
            rows += view.endpoint_rows(decided)
        rows += [
            ("Hardware", _hardware_text(host)),
            ("Port", str(decided.port)),
            *_instance_rows(decided),
            *_on_demand_rows(decided),
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
        if result.prerequisite is not None:
            rows.append(("Approve first", _prerequisite_text(result)))
        rows.append(("Hardware", f"{host.cpu_model} ({host.vendor})"))
    rows += [("Error", problem.text) for problem in result.errors]
    return table(rows, header=("Item", "Value"))


def _prerequisite_text(result: EndpointResult) -> str:
    first = result.prerequisite
    assert first is not None
    return (
        f"convert {first.model} to a {first.quantize} GGUF file ({first.output}) with "
        f"{first.engine}'s converter; epycctl approve {result.endpoint} does, then plans"
    )


def _engine_choice_rows(decided: EndpointDecisions) -> list[tuple[str, str]]:
    """Why its engine serves it: `engine = "auto"`'s rule and the engines passed over, the
    conversion of a safetensors model."""
    choice = decided.engine_choice
    if choice is None:
        return []
    rows = [
        ("Engine", f'{decided.engine} (engine = "{choice.asked}"): ' + "; ".join(choice.reasons))
    ]
    if choice.converted is not None:
        weights = choice.converted
        at = f" at {weights.source_revision}" if weights.source_revision else ""
        rows.append(
            ("Converted", f"{weights.source}{at} to {weights.quantize}, sha256 {weights.sha256}")
        )
    return rows


def _set_rows(decided: EndpointDecisions) -> list[tuple[str, str]]:
    """A set's fit and context are its tightest member's (each member's own are in its
    row); its CPUs and nodes are all of its members'."""
    worst = decided.tightest_server
    view = view_for(decided.engine)
    fit, cpu, context = view.server_rows(worst)
    where = "across sockets" if decided.socket is None else f"socket {decided.socket}"
    omp = view.set_bind_text(decided)
    return [
        (fit[0], f"tightest instance ({worst.instance}): {fit[1]}"),
        (
            cpu[0],
            f"{where} ({decided.socket_reason}), pinned {decided.cpus}{omp}, memory bound to "
            f"NUMA nodes {','.join(map(str, decided.numa_nodes))}",
        ),
        (context[0], f"tightest instance ({worst.instance}): {context[1]}"),
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
    from epycd.plan.pipeline.current import endpoint_specs, plan_endpoints
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
