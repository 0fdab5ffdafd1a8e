"""Planning every endpoint file together: spec + host + model + stack -> decisions -> units.

`plan_all` gathers what needs the outside world (endpoint files, model facts, a host vLLM
probe, listening ports, the HF cache folder) through functions it is given, so tests and the
daemon can pass their own; everything after that is pure. Endpoints are planned together so
that they get disjoint sockets (or NUMA node groups) and distinct ports; one endpoint's
error never stops another.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epycd.errors import EpycError, Refusal
from epycd.host.facts import HostFacts
from epycd.names import INSTANCE_SEPARATOR
from epycd.paths import endpoint_status_file
from epycd.plan.alloc import Placement, PlacementRequest, allocate
from epycd.plan.decide_cpu import decide
from epycd.plan.fingerprint import fingerprint, fingerprint_inputs, inputs_fingerprint
from epycd.plan.gpu import GpuPlacement
from epycd.plan.hfcache import resolve_hf_cache
from epycd.plan.instances import Region
from epycd.plan.model import (
    EndpointDecisions,
    HfCacheMount,
    Plan,
    Problem,
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
from epycd.plan.sharing import Sharing
from epycd.settings import Settings, trusted_admin_gid
from epycd.spec import SpecResult, load_endpoints
from epycd.stack import Stack, shipped_stack


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
