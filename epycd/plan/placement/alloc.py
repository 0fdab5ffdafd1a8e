"""Where each endpoint runs: a whole socket, or a group of its NUMA nodes (docs/sources.md,
"Socket choice").

All endpoints are placed together, in name order: approved endpoints first on the socket of
their approved plan (also those whose endpoint file is gone or does not plan now: their
units are still installed, `reserved`), then forced sockets, then the rest. Each endpoint gets
a socket of its own while there are sockets left; with more endpoints than sockets, sockets
that span several NUMA nodes (NPS2/NPS4) are split into disjoint groups of whole nodes, the
cores and memory of those nodes only. Auto placement prefers idle sockets (busy below the
threshold) in index order, then the least busy with a warning.

On-demand endpoints (docs/on-demand.md) take a seat like any other while there is one;
with none left they join a socket's swap seat: the on-demand endpoints of one socket that
share one seat's cores and memory, one running at a time. A plain endpoint never shares:
a member of a swap seat made plain keeps the seat only when no other member is left on it,
else it moves to a free seat or is refused, and the members that stay keep the seat.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from epycd.errors import EpycError, InputError, Refusal
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import HostFacts, SocketTopology
from epycd.names import INSTANCE_SEPARATOR
from epycd.sizes import GIB


@dataclass(frozen=True)
class PlacementRequest:
    name: str
    file: Path
    socket: int | None = None
    """A forced socket, or None for "auto"."""
    kept: int | None = None
    """For "auto": the socket of the endpoint's approved plan, kept while it has room, so
    that a new endpoint file never moves an approved endpoint."""
    on_demand: bool = False
    """It may join a swap seat."""
    kept_on_demand: bool = False
    """Its approved plan is on demand: its kept seat may be a swap seat it shared."""

    @property
    def leaves_swap_seat(self) -> bool:
        """Approved on demand, now a plain endpoint: it needs a seat of its own, and keeps
        its approved one only where no other member still sits (`_keep_approved`)."""
        return self.kept_on_demand and not self.on_demand


class Placement(BaseModel):
    socket: int
    numa_nodes: list[int]
    cpus: list[int] = Field(description="first thread of each core of these nodes")
    reason: str
    shares_socket: bool = False
    warnings: list[str] = Field(default_factory=list)
    swap_group: list[str] = Field(
        default_factory=list, description="an on-demand seat's endpoints, itself included"
    )

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)


def cpu_nodes(sock: SocketTopology, host: HostFacts) -> list[int]:
    """The socket's nodes that have CPUs (memory-only nodes cannot host an instance)."""
    with_cpus = {node.node for node in host.nodes if node.cpus}
    return [node for node in sorted(sock.numa_nodes) if node in with_cpus] or sorted(
        sock.numa_nodes
    )


def socket_preference(host: HostFacts, threshold: float) -> tuple[list[int], dict[int, str]]:
    """Sockets in the order auto placement takes them, and why each is where it is."""
    busy = host.socket_busy_pct
    indexes = [sock.socket for sock in host.socket_topology]
    if len(indexes) == 1:
        return indexes, {indexes[0]: "single socket"}
    if not busy:
        return indexes, {i: "load not sampled; sockets taken in order" for i in indexes}
    idle = [i for i in indexes if busy.get(i, 0.0) < threshold]
    loaded = sorted((i for i in indexes if i not in idle), key=lambda i: (busy.get(i, 0.0), i))
    why = {i: f"idle ({busy.get(i, 0.0):.1f} % busy < {threshold:g} %)" for i in idle}
    for i in loaded:
        prefix = "every socket busy; " if not idle else ""
        why[i] = f"{prefix}{busy.get(i, 0.0):.1f} % busy (>= {threshold:g} %)"
    return idle + loaded, why


def _split(nodes: list[int], parts: int) -> list[list[int]]:
    """`nodes` in `parts` contiguous groups, sizes as even as possible, larger first."""
    size, extra = divmod(len(nodes), parts)
    groups, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        groups.append(nodes[start:end])
        start = end
    return groups


def _node_cpus(host: HostFacts, sock: SocketTopology, nodes: list[int]) -> list[int]:
    physical = set(parse_cpulist(sock.physical_cpus))
    if nodes == cpu_nodes(sock, host):
        return sorted(physical)
    members = {cpu for node in nodes for cpu in host.node(node).cpus}
    return sorted(physical & members)


def _seat_labels(reserved: Mapping[str, Collection[int]]) -> dict[str, int]:
    """A label per reserved seat -> its socket: the endpoint's name for its first seat, and
    NAME_K (never an endpoint's name) for each further seat of a set, which sorts where a
    seat of that endpoint sorted before, so that the node groups fall where they fell."""
    labels: dict[str, int] = {}
    for name, sockets in reserved.items():
        for k, index in enumerate(sockets):
            labels[name if k == 0 else f"{name}{INSTANCE_SEPARATOR}{k}"] = index
    return labels


def _keep_approved(
    requests: Sequence[PlacementRequest],
    reserved: Mapping[str, Collection[int]],
    seats: _Seats,
) -> None:
    """Approved endpoints first, on their approved socket while it has room: those not
    requested (`reserved`: no result) and those whose file still lets them stay there; and
    every further seat of an approved set, requested or not."""
    requested = {r.name for r in requests}
    stays = {r.name: r.kept for r in requests if r.kept is not None and r.socket in (None, r.kept)}
    labels = _seat_labels(reserved)
    held = {name: index for name, index in labels.items() if name not in requested}
    leaving = {r.name for r in requests if r.leaves_swap_seat}
    # a member leaving a swap seat comes last, so the members that stay keep the seat
    for name, index in sorted((held | stays).items(), key=lambda item: (item[0] in leaving, item)):
        if index is not None and index in seats.members and seats.has_room(index, name):
            seats.seat(index, name, f"kept from its approved plan (socket {index})")


@dataclass
class _Seats:
    """The sockets of one `allocate` run: who sits on each, and why."""

    sockets: dict[int, SocketTopology]
    capacity: dict[int, int]
    """NUMA nodes with CPUs: the most seats a socket holds."""
    members: dict[int, list[str]]
    """Socket -> the endpoints with a seat of their own (a set's further seats as NAME_K)."""
    swapping: frozenset[str] = frozenset()
    """The on-demand endpoints, which may share a swap seat."""
    swap: dict[int, list[str]] = field(default_factory=dict)
    """Socket -> the on-demand endpoints of its swap seat (one seat however many)."""
    reasons: dict[str, str] = field(default_factory=dict)

    def used(self, index: int) -> int:
        return len(self.members[index]) + (1 if self.swap.get(index) else 0)

    def has_room(self, index: int, name: str) -> bool:
        """A free seat, or the socket's swap seat for an on-demand endpoint."""
        if name in self.swapping and self.swap.get(index):
            return True
        return self.used(index) < self.capacity[index]

    def seat(self, index: int, name: str, reason: str) -> None:
        if name in self.swapping:
            self.swap.setdefault(index, []).append(name)
        else:
            self.members[index].append(name)
        self.reasons[name] = reason

    def holders(self) -> list[str]:
        return [m for i in self.members for m in (*self.members[i], *self.swap.get(i, ()))]

    def seat_labels(self, index: int) -> list[tuple[str, list[str]]]:
        """Each seat of the socket in name order: its label, and who sits on it (the swap
        seat sorts by its first endpoint)."""
        seats = [(name, [name]) for name in self.members[index]]
        if group := sorted(self.swap.get(index, ())):
            seats.append((group[0], group))
        return sorted(seats)


def _seat_forced(
    forced: list[PlacementRequest], seats: _Seats, results: dict[str, Placement | EpycError]
) -> None:
    """Forced sockets in name order, each while it has room."""
    for request in forced:
        assert request.socket is not None
        if request.socket not in seats.sockets:
            results[request.name] = InputError(
                f"socket {request.socket} does not exist on this host "
                f"(sockets: {', '.join(map(str, sorted(seats.sockets)))})",
                file=request.file,
                key="socket",
                fix='choose an existing socket or "auto"',
            )
        elif not seats.has_room(request.socket, request.name):
            members = seats.members[request.socket] + seats.swap.get(request.socket, [])
            results[request.name] = _full(request, members, seats.sockets, seats.capacity)
        else:
            seats.seat(request.socket, request.name, f"forced by socket = {request.socket}")


def _seat_auto(
    auto: list[PlacementRequest],
    preference: tuple[list[int], dict[int, str]],
    seats: _Seats,
    results: dict[str, Placement | EpycError],
) -> None:
    """Each "auto" request in name order: the open socket with the fewest seats taken, the
    preferred first; an on-demand endpoint with no free seat left joins a swap seat."""
    order, why = preference
    for request in auto:
        free = [i for i in order if seats.used(i) < seats.capacity[i]]
        candidates = free or [i for i in order if seats.has_room(i, request.name)]
        if not candidates:
            results[request.name] = _full(request, seats.holders(), seats.sockets, seats.capacity)
            if request.leaves_swap_seat and request.kept is not None:
                results[request.name] = _no_seat_to_leave_for(request, request.kept, seats)
            continue
        least = min(seats.used(i) for i in candidates)
        chosen = next(i for i in candidates if seats.used(i) == least)
        seats.seat(chosen, request.name, why[chosen])


def allocate(
    requests: Sequence[PlacementRequest],
    host: HostFacts,
    threshold: float,
    reserved: Mapping[str, Collection[int]] | None = None,
    reserved_on_demand: Collection[str] = (),
) -> dict[str, Placement | EpycError]:
    """A placement, or the error saying why there is none, for every request. `reserved`:
    approved endpoint -> the sockets it sits on, one entry per seat (its socket, then one
    per further NUMA node of a set, `epycd.plan.placement.reservations.Held.seats`); a requested
    endpoint's first seat is its `kept` instead. `reserved_on_demand`: the approved endpoints
    that are on demand (a requested endpoint is as its request says)."""
    sockets = {sock.socket: sock for sock in host.socket_topology}
    capacity = {i: len(cpu_nodes(sock, host)) for i, sock in sockets.items()}
    preference = socket_preference(host, threshold)
    requested = {r.name for r in requests}
    swapping = {r.name for r in requests if r.on_demand}
    swapping |= {name for name in reserved_on_demand if name not in requested}
    seats = _Seats(sockets, capacity, {i: [] for i in sockets}, frozenset(swapping))
    results: dict[str, Placement | EpycError] = {}
    _keep_approved(requests, reserved or {}, seats)
    placed = set(seats.reasons)
    unplaced = sorted((r for r in requests if r.name not in placed), key=lambda r: r.name)
    _seat_forced([r for r in unplaced if r.socket is not None], seats, results)
    auto = [r for r in unplaced if r.socket is None]
    _seat_auto([r for r in auto if not r.on_demand], preference, seats, results)
    _seat_auto([r for r in auto if r.on_demand], preference, seats, results)
    for index in sockets:
        labels = seats.seat_labels(index)
        groups = _split(cpu_nodes(sockets[index], host), len(labels)) if labels else []
        for (_, sitting), nodes in zip(labels, groups, strict=True):
            group = sitting if sitting[0] in swapping else []
            for name in sitting:
                if name in requested:
                    placement = _placement(
                        host, sockets[index], nodes, seats.reasons[name], len(labels) > 1
                    )
                    results[name] = _swapping(placement, name, group)
    return results


def _swapping(placement: Placement, name: str, group: list[str]) -> Placement:
    """An on-demand endpoint's placement with its swap group, and why it shares."""
    if len(group) < 2:
        return placement.model_copy(update={"swap_group": group})
    others = ", ".join(g for g in group if g != name)
    reason = f"{placement.reason}; on demand, swaps with {others} (one runs at a time)"
    return placement.model_copy(update={"swap_group": group, "reason": reason})


def _placement(
    host: HostFacts, sock: SocketTopology, nodes: list[int], reason: str, shared: bool
) -> Placement:
    warnings = []
    if "every socket busy" in reason:
        warnings.append(f"every socket is busy; socket {sock.socket} is the least busy")
    all_nodes = cpu_nodes(sock, host)
    if shared:
        reason = f"{reason}; NUMA nodes {format_cpulist(nodes)} of {len(all_nodes)}"
    elif len(all_nodes) > 1:
        warnings.append(
            f"note: socket {sock.socket} spans {len(all_nodes)} NUMA nodes (NPS{sock.nps}); "
            "memory is bound to all of them; one instance per node may be faster"
        )
    return Placement(
        socket=sock.socket,
        numa_nodes=nodes,
        cpus=_node_cpus(host, sock, nodes),
        reason=reason,
        shares_socket=shared,
        warnings=warnings,
    )


def _full(
    request: PlacementRequest,
    holders: list[str],
    sockets: dict[int, SocketTopology],
    capacity: dict[int, int],
) -> EpycError:
    room = sum(capacity.values())
    names = sorted({holder.split(INSTANCE_SEPARATOR)[0] for holder in holders})
    if request.socket is not None:
        where = f"socket {request.socket} is taken by {', '.join(names)}"
        if capacity[request.socket] == 1:
            where += " and has one NUMA node (NPS1), so it cannot be split"
        return Refusal(
            where,
            file=request.file,
            key="socket",
            fix='set socket = "auto" or another socket, or remove an endpoint',
        )
    return Refusal(
        f"no socket or NUMA node left: this host holds at most {room} endpoints "
        f"({len(sockets)} sockets, {room} NUMA nodes with CPUs; one endpoint per socket, or "
        f"per NUMA node on NPS2/NPS4), held by {', '.join(names)}",
        file=request.file,
        key="socket",
        fix="remove an endpoint file (`epycctl remove` keeps it)"
        + (
            ", or set NPS2/NPS4 in the BIOS to split sockets by NUMA node"
            if min(capacity.values()) == 1
            else ""
        ),
    )


def _no_seat_to_leave_for(request: PlacementRequest, socket: int, seats: _Seats) -> EpycError:
    """A swap seat's member made a plain endpoint, with no seat of its own left for it."""
    members = ", ".join(sorted(m for m in seats.swap.get(socket, ()) if m != request.name))
    return Refusal(
        f"a plain endpoint needs a seat of its own and none is left: its approved plan "
        f"shares socket {socket}'s swap seat with {members or 'other endpoints'}, who keep it "
        f"(seats held by {', '.join(sorted(set(seats.holders())))})",
        file=request.file,
        key="socket",
        fix="set on_demand = true again to stay in the swap seat, or free a seat "
        "(`epycctl remove` an endpoint) so that it can move to a seat of its own",
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
