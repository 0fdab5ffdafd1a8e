"""The prepared endpoints placed together and each planned on its placement: Instinct GPU
endpoints first (their GPUs, `epycd.plan.placement.gpu`), the CPU endpoints on the other
NUMA nodes (their socket or nodes, `epycd.plan.placement.alloc`), distinct ports
(`epycd.plan.placement.ports`); each decided (a CPU endpoint by its engine's planner,
`epycd.plan.engines`, a set of instances by `epycd.plan.pipeline.multi`, an Instinct one by
its engine's planner on its GPUs) and finished (`epycd.plan.pipeline.finish`). A refused
endpoint that held a socket or a port is planned again without it, so that it takes nothing
from the others (`place_all`). An endpoint whose planning raises what no rule foresaw is its
own failure (`crashed`), and the others are planned as if it were absent: in its own
decisions (`_plan_guarded`), or in what the endpoints share, by placing them again one at a
time (`_place_isolated`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.paths import endpoint_status_file
from epycd.plan.endpoint import Endpoint, EndpointDecisions, Plan
from epycd.plan.engines import planner_for
from epycd.plan.model import HfCacheMount
from epycd.plan.pipeline.finish import plan_result, unfit
from epycd.plan.pipeline.multi import decide_set, regions, wants_instances
from epycd.plan.pipeline.on_demand import decide_on_demand, engine_ports
from epycd.plan.pipeline.result import EndpointResult, crashed, failed
from epycd.plan.placement.alloc import Placement, PlacementRequest, allocate
from epycd.plan.placement.gpu import GpuPlacement, GpuRequest, cpu_host_view, gpu_nodes, place_gpus
from epycd.plan.placement.instances import Region
from epycd.plan.placement.ports import Listener, PortRequest, assign_ports, listening_ports
from epycd.plan.placement.reservations import Reservations, address_book
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import Prepared
from epycd.settings import Settings


def _decide_placed(
    prepared: Prepared,
    share: Sharing,
    placement: Placement,
    port: int,
    instances: InstancesInput | None,
    engine_port: int | None = None,
) -> EndpointDecisions:
    if engine_port is not None:
        return decide_on_demand(prepared, share, placement, port, engine_port)
    if instances is not None:
        return instances.decide(prepared, port, share.hf_cache, share.product_python)
    server = planner_for(prepared.spec.engine).decide(
        prepared,
        host=share.host,
        stack=share.stack,
        placement=placement,
        port=port,
        hf_cache=share.hf_cache,
        product_python=share.product_python,
        status_file=str(endpoint_status_file(share.settings.run_dir, prepared.result.name)),
    )
    return Endpoint.of_server(server)


def _plan_one(
    prepared: Prepared,
    share: Sharing,
    placement: Placement,
    port: int,
    instances: InstancesInput | None = None,
    engine_port: int | None = None,
) -> EndpointResult:
    try:
        decisions = _decide_placed(prepared, share, placement, port, instances, engine_port)
    except EpycError as exc:
        if exc.file is None:
            exc.file = str(prepared.result.path)
        return failed(prepared.result, exc, model_facts=prepared.facts, route=prepared.route)
    fit = decisions.cpu_fit
    if fit is not None and not fit.fits:
        return unfit(prepared, decisions, share.host, share.stack)
    return plan_result(prepared, decisions, share)


@dataclass
class InstancesInput:
    """What an endpoint of several instances needs beyond its placement and port: the
    sockets it may use, the ports others hold (epycd.plan.pipeline.multi)."""

    share: Sharing
    parts: list[Region]
    taken_ports: set[int]

    def decide(
        self, prepared: Prepared, port: int, hf_cache: HfCacheMount, product_python: str
    ) -> EndpointDecisions:
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
    claimed: set[int],
    share: Sharing,
) -> InstancesInput | None:
    """For an endpoint with `instances` other than 1: the sockets and ports around it
    (`claimed`: every port given out in this round so far)."""
    name = prepared.result.name
    if not wants_instances(prepared.spec):
        return None
    reservations = share.reservations
    held = {p.socket for n, p in placements.items() if n != name and isinstance(p, Placement)}
    held |= reservations.sockets_held_except(name)
    taken = set(claimed) | reservations.ports_except(name)
    parts = regions(share.host, prepared.spec, placement, held, reservations.extra_nodes(name))
    return InstancesInput(share, parts, taken)


def _is_gpu(prepared: Prepared) -> bool:
    return prepared.spec.device == "instinct"


def _place_gpus(ready: list[Prepared], share: Sharing) -> dict[str, GpuPlacement | EpycError]:
    names = {p.result.name for p in ready}
    approved_gpus = share.reservations.gpus()
    requests = [
        GpuRequest(
            name=p.result.name,
            file=p.result.path,
            gpus=None if p.spec.gpus == "auto" else list(p.spec.gpus),
            sizer=planner_for(p.spec.engine).gpu_sizer(p),
            kept=approved_gpus.get(p.result.name),
        )
        for p in ready
    ]
    held = share.reservations.gpus_except(names)
    return place_gpus(requests, share.host, held)


def _cpu_view(
    host: HostFacts,
    placements: Mapping[str, GpuPlacement | EpycError],
    reservations: Reservations,
    planned: set[str],
) -> HostFacts:
    """The host without the NUMA nodes of placed GPU endpoints and of approved ones not
    planned in this round."""
    held = {i for gpus in reservations.gpus_except(planned).values() for i in gpus}
    nodes = gpu_nodes(placements) | {
        gpu.numa_node for gpu in host.gpus if gpu.index in held and gpu.numa_node is not None
    }
    return cpu_host_view(host, nodes)


def _plan_gpu(
    prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
) -> EndpointResult:
    try:
        server = planner_for(prepared.spec.engine).decide_on_gpus(prepared, share, placement, port)
    except EpycError as exc:
        return failed(prepared.result, exc, model_facts=prepared.facts, route=prepared.route)
    return plan_result(prepared, Endpoint.of_server(server), share)


def _placements(
    ready: list[Prepared], share: Sharing
) -> dict[str, Placement | GpuPlacement | EpycError]:
    """Instinct GPU endpoints placed first (`_place_gpus`); CPU endpoints get the other
    nodes. Approved endpoints not in `ready` keep their socket."""
    gpu_ready = [p for p in ready if _is_gpu(p)]
    gpu_placements = _place_gpus(gpu_ready, share)
    placements: dict[str, Placement | GpuPlacement | EpycError] = dict(gpu_placements)
    cpu_host = _cpu_view(
        share.host, gpu_placements, share.reservations, {p.result.name for p in ready}
    )
    placements |= allocate(
        [
            PlacementRequest(
                p.result.name,
                p.result.path,
                None if p.spec.socket == "auto" else p.spec.socket,
                kept=share.reservations.socket_of(p.result.name),
                on_demand=p.spec.on_demand,
                kept_on_demand=p.result.name in share.reservations.on_demand(),
            )
            for p in ready
            if not _is_gpu(p)
        ],
        cpu_host,
        share.stack.defaults.busy_threshold_pct,
        reserved=share.reservations.seats(),
        reserved_on_demand=share.reservations.on_demand(),
    )
    return placements


def _plan_placed(
    prepared: Prepared,
    placements: Mapping[str, Placement | GpuPlacement | EpycError],
    ports: Mapping[str, int | EpycError],
    share: Sharing,
    engine_ports: Mapping[str, int | EpycError] | None = None,
    claimed: set[int] | None = None,
) -> tuple[EndpointResult, bool]:
    """One endpoint's result, and whether it is refused while holding a socket or a port."""
    name = prepared.result.name
    placement, port = placements[name], ports[name]
    engine_port = (engine_ports or {}).get(name)
    failures = [x for x in (placement, port, engine_port) if isinstance(x, EpycError)]
    if failures:
        refused = failed(
            prepared.result, *failures, model_facts=prepared.facts, route=prepared.route
        )
        return refused, len(failures) < 2
    assert isinstance(port, int)
    if isinstance(placement, GpuPlacement):
        result = _plan_gpu(prepared, share, placement, port)
    else:
        assert isinstance(placement, Placement)
        if claimed is None:
            claimed = {p for p in ports.values() if isinstance(p, int)}
        instances = _instances_input(prepared, placement, placements, claimed, share)
        assert not isinstance(engine_port, EpycError)
        result = _plan_one(prepared, share, placement, port, instances, engine_port)
    return result, result.plan is None


def _plan_guarded(
    prepared: Prepared,
    placements: Mapping[str, Placement | GpuPlacement | EpycError],
    ports: Mapping[str, int | EpycError],
    share: Sharing,
    engine_ports: Mapping[str, int | EpycError] | None = None,
    claimed: set[int] | None = None,
) -> tuple[EndpointResult, bool]:
    """`_plan_placed` behind the planning boundary: what no rule foresaw in one endpoint's
    decisions is its own failure, which gives back its socket and port like any refusal."""
    try:
        return _plan_placed(prepared, placements, ports, share, engine_ports, claimed)
    except Exception as exc:
        return crashed(prepared.result, exc, "planning the endpoint"), True


def ports_of(plan: Plan) -> set[int]:
    """Every port a plan's units listen on: its own, its instances', its engine's."""
    decided = plan.decisions
    found = {decided.port, *(member.port for member in decided.members)}
    if decided.on_demand is not None:
        found.add(decided.on_demand.engine_port)
    return found


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
        approved=share.reservations.ports(),
        files=share.reservations.files(),
    )
    engines = engine_ports(ready, ports, share)
    claimed = {p for p in (*ports.values(), *engines.values()) if isinstance(p, int)}
    planned: dict[str, tuple[EndpointResult, bool]] = {}
    for prepared in sorted(ready, key=lambda p: p.result.name):
        result = _plan_guarded(prepared, placements, ports, share, engines, claimed)
        if result[0].plan is not None:
            claimed |= ports_of(result[0].plan)  # later sets' instances skip these
        planned[prepared.result.name] = result
    return planned


def place_all(ready: list[Prepared], share: Sharing) -> dict[str, EndpointResult]:
    """Every endpoint placed and planned (`place_together`); when what they share (their
    sockets, GPUs or ports) raises what no rule foresaw, the endpoints that make it raise
    are left out, each its own failure (`_place_isolated`)."""
    try:
        return place_together(ready, share)
    except Exception:
        return _place_isolated(ready, share)


def _place_isolated(ready: list[Prepared], share: Sharing) -> dict[str, EndpointResult]:
    """The endpoints placed together again, added one at a time in name order: one whose
    addition makes placing raise is left out as its own failure (`crashed`), so that the
    others are planned as if it were absent, as they are when it is refused."""
    kept: list[Prepared] = []
    left_out: dict[str, EndpointResult] = {}
    planned: dict[str, EndpointResult] = {}
    for prepared in sorted(ready, key=lambda p: p.result.name):
        try:
            planned = place_together([*kept, prepared], share)
        except Exception as exc:
            left_out[prepared.result.name] = crashed(
                prepared.result, exc, "placing the endpoint beside the others"
            )
            continue
        kept.append(prepared)
    return left_out | planned


def place_together(ready: list[Prepared], share: Sharing) -> dict[str, EndpointResult]:
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
    listeners: Mapping[int, Listener] | None,
    reservations: Reservations,
    settings: Settings,
    configured: Mapping[str, tuple[Path, int]],
) -> dict[int, Listener]:
    """The address book (`epycd.plan.placement.reservations.address_book`) with the ports
    listened on here (`listening_ports()` unless `listeners` are given)."""
    live = dict(listening_ports() if listeners is None else listeners)
    return address_book(settings, reservations, configured, live)
