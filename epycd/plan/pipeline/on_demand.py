"""Planning an on-demand endpoint (docs/on-demand.md): its engine on a loopback port of its
own (`engine_ports`), decided by its engine's planner as any endpoint of one server, and the
endpoint's service on its own address and port, which its `.socket` holds (`decide_on_demand`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from epycd.errors import EpycError
from epycd.listen import DEFAULT_HOST
from epycd.paths import endpoint_status_file
from epycd.plan.endpoint import Endpoint
from epycd.plan.engines import planner_for
from epycd.plan.model import OnDemand
from epycd.plan.pipeline.multi import instance_ports
from epycd.plan.placement.alloc import Placement
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import Prepared
from epycd.plan.service.served import exposure_reason


def engine_ports(
    ready: Sequence[Prepared], ports: Mapping[str, int | EpycError], share: Sharing
) -> dict[str, int | EpycError]:
    """Each on-demand endpoint's engine port, in name order: its approved one while no one
    else has it, else the first free port above its own, none another endpoint holds nor the
    address book (`share.listeners`) reserves for another."""
    reservations = share.reservations
    taken = {port: f"approved endpoint {name}" for name, port in reservations.ports().items()}
    taken |= {p: f"endpoint {name}" for name, p in ports.items() if isinstance(p, int)}
    taken |= {
        p: f"approved endpoint {name}'s engine" for name, p in _held_engine_ports(share).items()
    }
    results: dict[str, int | EpycError] = {}
    for prepared in sorted(ready, key=lambda p: p.result.name):
        name, port = prepared.result.name, ports.get(prepared.result.name)
        if not prepared.spec.on_demand or not isinstance(port, int):
            continue
        kept = reservations.engine_port(name)
        others = {p: holder for p, holder in taken.items() if p != kept}
        if kept is not None and kept not in others and kept != port:
            results[name] = kept
        else:
            try:
                results[name] = _first_engine_port(port, name, others, share)
            except EpycError as error:
                error.file = str(prepared.result.path)
                results[name] = error
                continue
        taken[results[name]] = f"endpoint {name}'s engine"  # type: ignore[index]
    return results


def _first_engine_port(port: int, name: str, taken: Mapping[int, str], share: Sharing) -> int:
    first = share.stack.defaults.first_port
    fix = (
        f'set port lower, or "auto" (counted up from the stack\'s first port, {first}), so that '
        "free ports are above it; or plan fewer on-demand endpoints (each takes one engine port "
        "above its own)"
    )
    what = "the engine of this on-demand endpoint (a loopback port above its port)"
    return instance_ports(port, 1, name, taken, share.listeners, what=what, fix=fix)[0]


def _held_engine_ports(share: Sharing) -> dict[str, int]:
    return {
        name: port
        for name in share.reservations.on_demand()
        if (port := share.reservations.engine_port(name)) is not None
    }


def decide_on_demand(
    prepared: Prepared, share: Sharing, placement: Placement, port: int, engine_port: int
) -> Endpoint:
    """The engine decided on loopback at `engine_port`; the endpoint on the file's address
    and `port`, with how it starts, stops and swaps."""
    spec, name = prepared.spec, prepared.result.name
    loopback = replace(prepared, spec=spec.model_copy(update={"host": DEFAULT_HOST}))
    on_demand = OnDemand(
        engine_port=engine_port,
        idle_stop_s=spec.idle_stop_s,
        swap_group=list(placement.swap_group) or [name],
    )
    server = planner_for(spec.engine).decide(
        loopback,
        host=share.host,
        stack=share.stack,
        placement=placement,
        port=engine_port,
        hf_cache=share.hf_cache,
        product_python=share.product_python,
        status_file=str(endpoint_status_file(share.settings.run_dir, name)),
    )
    reasons = [r for r in server.confirmation_reasons if "listens on" not in r]
    if exposed := exposure_reason(spec, port):
        reasons.append(exposed)
    server = server.model_copy(update={"on_demand": on_demand})
    endpoint = Endpoint.of_server(server)
    return endpoint.model_copy(
        update={
            "port": port,
            "host": spec.host,
            "requires_confirmation": bool(reasons),
            "confirmation_reasons": reasons,
        }
    )
