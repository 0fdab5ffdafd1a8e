"""Ports: distinct across endpoints, free on the host.

With `--network=host` a port in use is fatal at start, so "auto" takes the first port from
the stack's first port that no other endpoint claims and no process listens on. A port held
by the endpoint's own running unit (its process sits in the cgroup of `epyc-llm-NAME.service`)
counts as free for that endpoint, and an "auto" endpoint whose unit already listens keeps the
lowest such port from the first port up, so re-planning a running endpoint keeps its port.
A docker container runs outside its unit's cgroup (under dockerd's): its process is the
endpoint's when docker's record of the container names it `epyc-llm-NAME` (the unit's
`docker run --name`). That record is root's: for other users the port looks foreign.

The port of an approved plan (`approved`) belongs to that endpoint while the approval
stands, running or not (after `--no-start` or `epycctl stop`): an "auto" endpoint keeps it,
no other endpoint gets it, and an explicit request for it is refused naming the holder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epycd.errors import EpycError, InputError, Refusal
from epycd.names import ENDPOINT_NAME_RULE, UNIT_IN_CGROUP, UNIT_PREFIX
from epycd.readfile import FOREIGN_RECORD_MAX_BYTES, PROC_MAX_BYTES, read_bytes, read_text

DOCKER_IN_CGROUP = re.compile(r"docker[-/]([0-9a-f]{64})\b")
"""cgroupfs driver: `/docker/ID`; systemd driver: `/system.slice/docker-ID.scope`."""
CONTAINER_NAME = re.compile(rf"/{re.escape(UNIT_PREFIX)}({ENDPOINT_NAME_RULE})")
DOCKER_CONTAINERS = Path("/var/lib/docker/containers")
LAST_PORT = 65535


@dataclass(frozen=True)
class Listener:
    """A process listening on a TCP port, and the endpoint whose unit it belongs to; or an
    address the address book reserves (`reserved`), whether anything listens there or not
    (epycd.plan.placement.reservations.address_book)."""

    pid: int | None
    process: str | None
    endpoint: str | None
    reserved: str | None = None
    """What holds the address, naming its file and key (e.g. "the gateway's address
    (gateway_listen in /etc/epyc-llm/epycd.conf)"); None for a live listener."""
    fix: str | None = None
    """How to move the holder off the port, for a refusal's fix."""

    def describe(self) -> str:
        if self.reserved is not None:
            return self.reserved
        if self.pid is None:
            return self.process or "another process"
        return f"{self.process or 'process'} (pid {self.pid})"


def reserved(what: str, fix: str, endpoint: str | None = None) -> Listener:
    """An address the address book holds for `what` (nothing need listen there)."""
    return Listener(pid=None, process=None, endpoint=endpoint, reserved=what, fix=fix)


def in_use_summary(
    first: int, last: int, name: str, taken: Mapping[int, str], listeners: Mapping[int, Listener]
) -> str:
    """Who holds the ports `first`..`last` that endpoint `name` cannot have: how many, by
    whom (the endpoints' ports of `taken`, the address book's and live listeners)."""
    if first > last:
        return f"the range {first}-{last} is empty (no port is above {first - 1})"
    counts: dict[str, int] = {}
    for port in range(first, last + 1):
        listener = listeners.get(port)
        holder = taken.get(port) or (
            listener.describe() if listener is not None and listener.endpoint != name else None
        )
        if holder is not None:
            counts[holder] = counts.get(holder, 0) + 1
    size = last - first + 1
    held = sum(counts.values())
    by = ", ".join(f"{n} by {holder}" for holder, n in sorted(counts.items()))
    return f"{held} of the {size} ports {first}-{last} are in use" + (f": {by}" if by else "")


@dataclass(frozen=True)
class PortRequest:
    name: str
    file: Path
    port: int | None
    """An explicit port, or None for "auto"."""


def endpoint_of_pid(
    pid: int, proc: Path = Path("/proc"), docker_containers: Path = DOCKER_CONTAINERS
) -> str | None:
    try:
        cgroup = read_text(proc / str(pid) / "cgroup", PROC_MAX_BYTES, errors="replace")
    except OSError:
        return None
    match = UNIT_IN_CGROUP.search(cgroup)
    if match:
        return match.group(1)
    container = DOCKER_IN_CGROUP.search(cgroup)
    return docker_endpoint(docker_containers / container.group(1)) if container else None


def docker_endpoint(container: Path) -> str | None:
    """The endpoint a docker container runs for, by the name in docker's record of it."""
    try:
        record = json.loads(read_bytes(container / "config.v2.json", FOREIGN_RECORD_MAX_BYTES))
    except (OSError, ValueError):
        return None
    name = record.get("Name") if isinstance(record, dict) else None
    match = CONTAINER_NAME.fullmatch(name) if isinstance(name, str) else None
    return match.group(1) if match else None


def listening_ports() -> dict[int, Listener]:
    """TCP ports something listens on, on the machine this process runs on (psutil)."""
    import psutil

    ports: dict[int, Listener] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr:
            continue
        name = None
        if conn.pid is not None:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                name = None
        endpoint = endpoint_of_pid(conn.pid) if conn.pid is not None else None
        ports.setdefault(conn.laddr.port, Listener(conn.pid, name, endpoint))
    return ports


def _taken_on_host(port: int, name: str, listeners: Mapping[int, Listener]) -> Listener | None:
    listener = listeners.get(port)
    if listener is None or listener.endpoint == name:
        return None
    return listener


@dataclass
class _PortBook:
    """The ports given out in one `assign_ports` run: who claimed which, each request's
    port or refusal, and what already holds ports (approvals, listeners)."""

    listeners: Mapping[int, Listener]
    approved: Mapping[str, int]
    first_port: int
    files: Mapping[str, str] = field(default_factory=dict)
    """Approved endpoint -> its endpoint file, for refusals that name it."""
    explicit: set[int] = field(default_factory=set)
    claimed: dict[int, str] = field(default_factory=dict)
    results: dict[str, int | EpycError] = field(default_factory=dict)
    holders: dict[int, str] = field(init=False)
    """Approved port -> its endpoint."""

    def __post_init__(self) -> None:
        self.holders = {port: name for name, port in sorted(self.approved.items())}

    def held_by_other(self, port: int, name: str) -> str | None:
        """The approved endpoint other than `name` whose port this is."""
        holder = self.holders.get(port)
        return holder if holder is not None and holder != name else None

    def claim(self, port: int, name: str) -> None:
        self.claimed[port] = name
        self.results[name] = port

    def explicit_refusal(self, request: PortRequest) -> EpycError | None:
        """Why an explicit port cannot be had: an approval, another endpoint or a process
        holds it."""
        assert request.port is not None
        holder = self.held_by_other(request.port, request.name)
        if holder is not None:
            where = f" ({self.files[holder]})" if holder in self.files else ""
            return Refusal(
                f"port {request.port} is the port of approved endpoint {holder}{where}, "
                "reserved for it whether it runs or not",
                file=request.file,
                key="port",
                fix=f'choose another port or "auto", or `epycctl remove {holder}` first',
            )
        if request.port in self.claimed:
            return InputError(
                f"port {request.port} is also the port of endpoint {self.claimed[request.port]}",
                file=request.file,
                key="port",
                fix='choose another port or "auto"',
            )
        listener = _taken_on_host(request.port, request.name, self.listeners)
        if listener is not None and listener.reserved is not None:
            return Refusal(
                f"port {request.port} is reserved: it is {listener.reserved}",
                file=request.file,
                key="port",
                fix=f'choose another port or "auto" here, or {listener.fix}',
            )
        if listener is not None:
            return Refusal(
                f"port {request.port} is in use on this host by {listener.describe()}",
                file=request.file,
                key="port",
                fix='choose a free port or "auto"',
            )
        return None

    def kept(self, name: str) -> int | None:
        """The approved port of "auto" endpoint `name`, while no one else has it."""
        kept = self.approved.get(name)
        if kept is None or kept in self.claimed:
            return None
        return kept if _taken_on_host(kept, name, self.listeners) is None else None

    def own_listening(self, name: str) -> int | None:
        """The lowest port from the first port up that `name`'s own unit listens on, while
        no one else has it."""
        held = sorted(
            port
            for port, listener in self.listeners.items()
            if listener.endpoint == name
            and port >= self.first_port
            and port not in self.claimed
            and port not in self.explicit
            and self.held_by_other(port, name) is None
        )
        return held[0] if held else None

    def is_free(self, port: int, name: str) -> bool:
        return not (
            port in self.claimed
            or port in self.explicit
            or self.held_by_other(port, name) is not None
            or _taken_on_host(port, name, self.listeners) is not None
        )


def _claim_free(book: _PortBook, auto: list[PortRequest]) -> None:
    """The first free port from the first port up, for each "auto" request still without."""
    candidate = book.first_port
    for request in auto:
        if request.name in book.results:
            continue
        while candidate <= LAST_PORT and not book.is_free(candidate, request.name):
            candidate += 1
        if candidate > LAST_PORT:
            book.results[request.name] = Refusal(
                f"no free port from {book.first_port} up", file=request.file, key="port"
            )
            continue
        book.claim(candidate, request.name)


def assign_ports(
    requests: Sequence[PortRequest],
    listeners: Mapping[int, Listener],
    first_port: int,
    approved: Mapping[str, int] | None = None,
    files: Mapping[str, str] | None = None,
) -> dict[str, int | EpycError]:
    """Explicit ports first (in name order), then "auto" ports: the approved one, the one
    the endpoint's unit listens on, else the first free from `first_port` up. `listeners`
    is the address book (what is reserved or listens), `files` the approved endpoints'."""
    book = _PortBook(listeners, approved or {}, first_port, files or {})
    for request in sorted(requests, key=lambda r: r.name):
        if request.port is None:
            continue
        refusal = book.explicit_refusal(request)
        if refusal is not None:
            book.results[request.name] = refusal
        else:
            book.claim(request.port, request.name)
    book.explicit |= {r.port for r in requests if r.port is not None}
    auto = sorted((r for r in requests if r.port is None), key=lambda r: r.name)
    for request in auto:
        if (kept := book.kept(request.name)) is not None:
            book.claim(kept, request.name)
    for request in auto:
        own = None if request.name in book.results else book.own_listening(request.name)
        if own is not None:
            book.claim(own, request.name)
    _claim_free(book, auto)
    return book.results
