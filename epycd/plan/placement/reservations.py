"""What the approved plans hold while others are planned (`Reservations`): each approved
endpoint's socket and NUMA nodes, its port and its instances' ports, its Instinct GPUs.

An approved endpoint keeps what it holds ("auto" endpoints stay where they were approved),
and no other endpoint is given any of it, whether its units run or not and whether its file
is still there: adding an endpoint file never moves an approved one nor lands on it
(docs/instances.md for the sets of instances). `Reservations.of` is the only builder.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.placement.ports import Listener


@dataclass(frozen=True)
class Held:
    """What one approved endpoint holds.

    `socket` is its plan's socket (None for an Instinct endpoint, which holds `gpus`
    instead). `nodes` is socket -> NUMA nodes of a set's instances (empty for one
    instance: its socket is its seat)."""

    endpoint: str
    socket: int | None = None
    nodes: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    port: int | None = None
    instance_ports: tuple[int, ...] = ()
    """A set's instances' ports, or an on-demand endpoint's engine port."""
    gpus: tuple[int, ...] = ()
    on_demand: bool = False

    def _node_seats(self) -> list[tuple[int, int]]:
        return sorted((socket, node) for socket, nodes in self.nodes.items() for node in nodes)

    def seats(self) -> list[int]:
        """The sockets it sits on, one entry per seat (`epycd.plan.placement.alloc.allocate`): its
        socket, then the socket of each node of a set but the first, which no other
        endpoint may be given a part of."""
        first = [] if self.socket is None else [self.socket]
        return first + [socket for socket, _ in self._node_seats()[1:]]

    def extra_nodes(self) -> set[int]:
        """The NUMA nodes of a set but the first (epycd.plan.pipeline.multi.regions)."""
        return {node for _, node in self._node_seats()[1:]}


def held_socket(decisions: EndpointDecisions) -> int | None:
    """The socket an approved plan keeps: a CPU endpoint's, a set's first (on its own socket
    every member is on it); None for an Instinct endpoint, which holds GPUs."""
    if decisions.device != "cpu":
        return None
    return min(server.socket for server in decisions.servers)


@dataclass(frozen=True)
class Reservations:
    """Endpoint -> what its approved plan holds."""

    held: Mapping[str, Held] = field(default_factory=dict)

    @classmethod
    def of(cls, approved: Mapping[str, Plan]) -> Reservations:
        """What each approved plan holds: an Instinct plan its GPUs, a CPU plan its socket,
        a set of instances every NUMA node its instances use (on its own socket and, with
        `placement = "host"`, on the others) and its instances' ports."""
        held = {}
        for name, plan in approved.items():
            decisions = plan.decisions
            members = decisions.members
            nodes: dict[int, tuple[int, ...]] = {}
            for member in members:
                mine = {*nodes.get(member.socket, ()), *member.numa_nodes}
                nodes[member.socket] = tuple(sorted(mine))
            on_demand = decisions.on_demand
            held[name] = Held(
                endpoint=name,
                socket=held_socket(decisions),
                nodes=nodes,
                port=decisions.port,
                instance_ports=tuple(m.port for m in members)
                + ((on_demand.engine_port,) if on_demand else ()),
                gpus=tuple(decisions.gpus_held),
                on_demand=on_demand is not None,
            )
        return cls(held)

    def socket_of(self, name: str) -> int | None:
        """The approved socket of `name` (None: none, or an Instinct endpoint)."""
        held = self.held.get(name)
        return None if held is None else held.socket

    def seats(self) -> dict[str, list[int]]:
        """Endpoint -> the sockets it sits on (`Held.seats`), for `allocate`'s `reserved`."""
        return {name: seats for name, h in self.held.items() if (seats := h.seats())}

    def on_demand(self) -> set[str]:
        """The approved endpoints that are on demand (they may share a swap seat)."""
        return {name for name, h in self.held.items() if h.on_demand}

    def engine_port(self, name: str) -> int | None:
        """The engine port of approved on-demand endpoint `name`."""
        held = self.held.get(name)
        return held.instance_ports[0] if held is not None and held.on_demand else None

    def socket_listeners(self, live: Mapping[int, Listener]) -> dict[int, Listener]:
        """The ports of approved on-demand endpoints that systemd (PID 1) listens on: their
        `.socket` units, the endpoint's own."""
        return {
            h.port: Listener(pid=1, process="systemd", endpoint=name)
            for name, h in self.held.items()
            if h.on_demand and h.port is not None and (seen := live.get(h.port)) and seen.pid == 1
        }

    def sockets_held_except(self, name: str) -> set[int]:
        """The sockets every other approved endpoint sits on."""
        return {s for other, h in self.held.items() if other != name for s in h.seats()}

    def extra_nodes(self, name: str) -> set[int]:
        """The NUMA nodes of `name`'s approved set but the first (`Held.extra_nodes`)."""
        held = self.held.get(name)
        return set() if held is None else held.extra_nodes()

    def ports(self) -> dict[str, int]:
        """Endpoint -> its approved port."""
        return {name: h.port for name, h in self.held.items() if h.port is not None}

    def ports_except(self, name: str) -> set[int]:
        return {port for other, port in self.ports().items() if other != name}

    def gpus(self) -> dict[str, list[int]]:
        """Endpoint -> its approved Instinct GPUs (only endpoints that hold some)."""
        return {name: list(h.gpus) for name, h in self.held.items() if h.gpus}

    def gpus_except(self, names: Collection[str]) -> dict[str, list[int]]:
        """The GPUs held by approved endpoints not in `names` (not planned in this round)."""
        return {name: gpus for name, gpus in self.gpus().items() if name not in names}

    def listeners(self) -> dict[int, Listener]:
        """The instance ports of approved sets and the engine ports of approved on-demand
        endpoints, as if their units listened on them."""
        return {
            port: Listener(
                pid=None, process=f"an instance of approved endpoint {name}", endpoint=name
            )
            for name, h in self.held.items()
            for port in h.instance_ports
        }


NOTHING_HELD = Reservations()
"""No approved plan holds anything (a first plan, tests)."""
