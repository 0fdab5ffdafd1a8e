"""What the approved plans hold while others are planned (`Reservations`): each approved
endpoint's socket and NUMA nodes, its port and its instances' ports, its Instinct GPUs.

An approved endpoint keeps what it holds ("auto" endpoints stay where they were approved),
and no other endpoint is given any of it, whether its units run or not and whether its file
is still there: adding an endpoint file never moves an approved one nor lands on it
(docs/instances.md for the sets of instances). `Reservations.of` is the only builder.

The ports are one address book (`address_book`): the gateway's addresses (gateway_listen,
gateway_metrics_listen, and those of the approved gateway while its approval stands), epycd's
metrics_listen, every approved endpoint's public, instance and engine ports, the port of
every endpoint file that asks for one, and what listens here. Every port choice reads it:
an explicit port on one of them is refused naming the holder, its file and key; "auto"
ports, instance ports and on-demand engine ports skip them all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from epycd.errors import EpycError
from epycd.paths import gateway_approval_file
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.placement.ports import Listener, reserved
from epycd.readfile import STATE_MAX_BYTES, read_model
from epycd.settings import Settings, parse_listen


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
    file: str | None = None
    """Its endpoint file, as its approved plan names it."""

    def ports_held(self) -> dict[int, str]:
        """Each port it holds -> what that port is to it."""
        kinds = "an engine port" if self.on_demand else "an instance port"
        held = {port: kinds for port in self.instance_ports}
        if self.port is not None:
            held[self.port] = "the port"
        return held

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
                file=decisions.config_file,
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

    def files(self) -> dict[str, str]:
        """Endpoint -> its endpoint file, as its approved plan names it."""
        return {name: h.file for name, h in self.held.items() if h.file is not None}

    def listeners(self) -> dict[int, Listener]:
        """Every port of every approved endpoint (its own, its instances', its engine's),
        reserved for it whether its units run or not."""
        return {
            port: reserved(
                f"{kind} of approved endpoint {name}" + (f" ({h.file})" if h.file else ""),
                f"`epycctl remove {name}` first",
                endpoint=name,
            )
            for name, h in sorted(self.held.items())
            for port, kind in h.ports_held().items()
        }


def settings_addresses(settings: Settings) -> dict[int, Listener]:
    """The ports epycd.conf gives the gateway (while gateway_listen is set) and epycd's own
    /metrics."""
    conf = settings.daemon_conf
    keys = {"metrics_listen": ("epycd's /metrics", settings.metrics_listen)}
    if settings.gateway_listen:
        keys["gateway_listen"] = ("the gateway's address", settings.gateway_listen)
        keys["gateway_metrics_listen"] = ("the gateway's metrics", settings.gateway_metrics_listen)
    return {
        parse_listen(value)[1]: reserved(
            f"{what} ({key} = {value!r} in {conf})", f"change {key} in {conf}"
        )
        for key, (what, value) in keys.items()
        if value
    }


class GatewayAddresses(BaseModel):
    """The addresses of the gateway's approval record (the rest of it is the gateway's)."""

    model_config = ConfigDict(extra="ignore")
    listen: str
    metrics_listen: str = ""


def approved_gateway_addresses(settings: Settings) -> dict[int, Listener]:
    """The ports of the approved gateway, while its approval stands (its units installed,
    running or not, whatever gateway_listen says now)."""
    record = gateway_approval_file(settings.state_dir)
    try:
        approval = read_model(record, STATE_MAX_BYTES, GatewayAddresses, fix="")
    except (OSError, EpycError):
        return {}  # none, or unreadable: the gateway's own commands say so
    found: dict[int, Listener] = {}
    for what, value in (("address", approval.listen), ("metrics", approval.metrics_listen)):
        try:
            port = parse_listen(value)[1] if value else None
        except ValueError:
            continue
        if port is not None:
            found[port] = reserved(
                f"the approved gateway's {what} {value} (its approval {record})",
                "change gateway_listen and `epycctl gateway approve`, or `epycctl gateway remove`",
            )
    return found


def configured_addresses(files: Mapping[str, tuple[Path, int]]) -> dict[int, Listener]:
    """The ports endpoint files ask for that nothing else claims in this plan (a file that
    does not plan now, e.g. its model missing): once fixed, it needs its port free."""
    return {
        port: reserved(
            f"the port of endpoint file {path} (port = {port}), which does not plan now",
            f"change port in {path}",
            endpoint=name,
        )
        for name, (path, port) in sorted(files.items())
    }


def address_book(
    settings: Settings,
    reservations: Reservations,
    configured: Mapping[str, tuple[Path, int]],
    live: Mapping[int, Listener],
) -> dict[int, Listener]:
    """Every port held here and by whom: the settings', the approved gateway's, the endpoint
    files' that do not plan (`configured`), the approved endpoints' (which keep theirs
    against later settings), what listens (`live`, which wins: a foreign process on a
    reserved port is that process), and the approved on-demand ports that systemd holds
    (their own `.socket`)."""
    book = settings_addresses(settings) | approved_gateway_addresses(settings)
    book |= configured_addresses(configured) | reservations.listeners()
    return book | dict(live) | reservations.socket_listeners(live)


NOTHING_HELD = Reservations()
"""No approved plan holds anything (a first plan, tests)."""
