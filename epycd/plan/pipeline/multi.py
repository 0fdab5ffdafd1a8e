"""Planning an endpoint of several instances (docs/instances.md): the layout of
`epycd.plan.placement.instances`, each instance decided as a whole endpoint on its own cores, nodes,
share of memory and loopback port, and the set's decisions for the balancer in front.

An "auto" layout of one instance is the plain endpoint: no balancer, the reasons in its
socket reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path

from epycd.errors import InputError, Refusal
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.listen import DEFAULT_HOST
from epycd.names import instance_unit_name
from epycd.plan.endpoint import Endpoint, InstanceSet
from epycd.plan.engines import planner_for
from epycd.plan.healing import balancer_healing
from epycd.plan.model import CpuServer, EndpointService, HfCacheMount
from epycd.plan.placement.alloc import Placement, cpu_nodes
from epycd.plan.placement.instances import Layout, Region, plan_layout, region_of
from epycd.plan.placement.ports import LAST_PORT, Listener, in_use_summary
from epycd.plan.prepared import Prepared
from epycd.plan.service.served import exposure_reason
from epycd.plan.service.unit_commands import approval_check_argv
from epycd.spec import EndpointSpec
from epycd.stack import Stack


def wants_instances(spec: EndpointSpec) -> bool:
    return spec.instances != 1


def regions(
    host: HostFacts,
    spec: EndpointSpec,
    placement: Placement,
    held_by_others: Collection[int],
    approved_nodes: Collection[int] = (),
) -> list[Region]:
    """The endpoint's own placement, with the nodes of its socket its approval holds
    (`approved_nodes`, epycd.plan.pipeline.current.approved_sockets), and with `placement = "host"`
    every other socket no other endpoint holds, in socket order."""
    sock = next(s for s in host.socket_topology if s.socket == placement.socket)
    extra = {n for n in cpu_nodes(sock, host) if n in approved_nodes} - set(placement.numa_nodes)
    if extra:
        nodes = sorted({*placement.numa_nodes, *extra})
        members = {cpu for node in nodes for cpu in host.node(node).cpus}
        cpus = [cpu for cpu in parse_cpulist(sock.physical_cpus) if cpu in members]
        own = region_of(host, placement.socket, nodes, cpus)
    else:
        own = region_of(host, placement.socket, placement.numa_nodes, placement.cpus)
    if spec.placement == "socket":
        return [own]
    others = [
        Region(sock, cpu_nodes(sock, host), parse_cpulist(sock.physical_cpus))
        for sock in host.socket_topology
        if sock.socket != placement.socket and sock.socket not in held_by_others
    ]
    return sorted([own, *others], key=lambda region: region.socket.socket)


def instance_ports(
    port: int,
    count: int,
    name: str,
    taken: Collection[int] | Mapping[int, str],
    listeners: Mapping[int, Listener],
    *,
    what: str = "the instances",
    fix: str = 'set port lower (or "auto") so that there are free ports above it',
) -> list[int]:
    """The first `count` free ports after the endpoint's port (for a set's instances, an
    on-demand endpoint's engine): none another endpoint claims (`taken`, which may name
    whose each is) and none the address book holds for another (`listeners`). Out of them:
    a refusal naming the range, how many are in use by whom, and `fix`."""
    ports: list[int] = []
    candidate = port + 1
    while len(ports) < count and candidate <= LAST_PORT:
        listener = listeners.get(candidate)
        if candidate not in taken and (listener is None or listener.endpoint == name):
            ports.append(candidate)
        candidate += 1
    if len(ports) < count:
        named = taken if isinstance(taken, Mapping) else dict.fromkeys(taken, "other endpoints")
        used = in_use_summary(port + 1, LAST_PORT, name, named, listeners)
        raise Refusal(
            f"no {'free port' if count == 1 else f'{count} free ports'} above {port} (its port) "
            f"for {what}: {used}",
            key="port",
            fix=fix,
        )
    return ports


def _layout(prepared: Prepared, host: HostFacts, stack: Stack, parts: list[Region]) -> Layout:
    planner = planner_for(prepared.spec.engine)

    def fits(nodes: list[int], share: float) -> bool:
        cpus = sorted(cpu for node in nodes for cpu in host.node(node).cpus)
        trial = Placement(socket=0, numa_nodes=nodes, cpus=cpus, reason="")
        return planner.fits(prepared, host, stack, trial, share)

    file = str(prepared.result.path)
    layout = plan_layout(host, parts, prepared.spec.instances, fits, file)
    if layout.count > 1:
        warnings = [*layout.warnings, *planner.layout_warnings(layout.slots)]
        layout = layout.model_copy(update={"warnings": warnings})
    min_ready = prepared.spec.min_ready
    if min_ready is not None and min_ready > layout.count:
        raise InputError(
            f"min_ready = {min_ready} is more than the {layout.count} instance(s) planned",
            file=file,
            key="min_ready",
            fix=f"set min_ready to at most {layout.count}, or remove it (all must be ready)",
        )
    return layout


def decide_set(
    prepared: Prepared,
    *,
    host: HostFacts,
    stack: Stack,
    parts: list[Region],
    port: int,
    taken_ports: Collection[int],
    listeners: Mapping[int, Listener],
    hf_cache: HfCacheMount,
    product_python: str,
    run_dir: Path,
) -> Endpoint:
    """The set's decisions: each instance decided on its slot (vLLM's or llama-server's
    decisions), the balancer on `port`."""
    name, spec = prepared.result.name, prepared.spec
    layout = _layout(prepared, host, stack, parts)
    common = {"host": host, "stack": stack, "hf_cache": hf_cache, "product_python": product_python}
    decide_one = planner_for(prepared.spec.engine).decide
    if layout.count == 1:
        slot = layout.slots[0]
        placement = Placement(socket=slot.socket, numa_nodes=slot.numa_nodes, cpus=slot.cpus,
                              reason="; ".join(layout.reasons))  # fmt: skip
        status = str(run_dir / "endpoints" / name / "status.json")
        server = decide_one(prepared, placement=placement, port=port, status_file=status, **common)  # type: ignore[arg-type]
        return Endpoint.of_server(server)
    loopback = replace(prepared, spec=spec.model_copy(update={"host": DEFAULT_HOST}))
    ports = instance_ports(port, layout.count, name, taken_ports, listeners)
    members: list[CpuServer] = []
    for slot, instance_port in zip(layout.slots, ports, strict=True):
        placement = Placement(socket=slot.socket, numa_nodes=slot.numa_nodes, cpus=slot.cpus,
                              reason=slot.reason)  # fmt: skip
        decided = decide_one(
            loopback,
            placement=placement,
            port=instance_port,
            status_file=str(run_dir / "endpoints" / name / f"instance-{slot.index}.json"),
            memory_share=slot.memory_share,
            **common,  # type: ignore[arg-type]
        )
        unit = instance_unit_name(name, slot.index)
        members.append(
            decided.model_copy(
                update={
                    "unit_name": unit,
                    "instance": slot.index,
                    "exec_condition": [approval_check_argv(product_python, name, unit)],
                }
            )
        )
    return _set_decisions(prepared, layout, members, port)


def _set_decisions(
    prepared: Prepared, layout: Layout, members: list[CpuServer], port: int
) -> Endpoint:
    """The set's endpoint: the members' service, on the endpoint's own address and port,
    with the balancer's own unit, approval check and healing; the members its servers."""
    spec, name = prepared.spec, prepared.result.name
    reasons = [r for r in members[0].confirmation_reasons if "listens on" not in r]
    if exposed := exposure_reason(spec, port):
        reasons.append(exposed)
    warnings = list(dict.fromkeys(w for m in members for w in m.warnings)) + layout.warnings
    instances = InstanceSet(
        requested=layout.requested,
        placement=spec.placement,
        count=layout.count,
        min_ready=spec.min_ready or layout.count,
        reasons=layout.reasons,
    )
    service = members[0].model_dump(include=set(EndpointService.model_fields))
    start_timeout_s = max(m.start_timeout_s for m in members)
    return Endpoint.model_validate(
        {
            **service,
            "unit_name": members[0].unit_name.rsplit("_", 1)[0],
            "start_timeout_s": start_timeout_s,
            "port": port,
            "host": spec.host,
            "status_file": None,
            "exec_condition": [approval_check_argv(members[0].product_python, name)],
            "healing": balancer_healing(spec.restart, start_timeout_s),
            "requires_confirmation": bool(reasons),
            "confirmation_reasons": reasons,
            "warnings": warnings,
            "servers": members,
            "instances": instances,
        }
    )
