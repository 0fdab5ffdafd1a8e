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
from dataclasses import dataclass
from pathlib import Path

from epycd.errors import EpycError, InputError, Refusal
from epycd.names import ENDPOINT_NAME_RULE, UNIT_IN_CGROUP, UNIT_PREFIX

DOCKER_IN_CGROUP = re.compile(r"docker[-/]([0-9a-f]{64})\b")
"""cgroupfs driver: `/docker/ID`; systemd driver: `/system.slice/docker-ID.scope`."""
CONTAINER_NAME = re.compile(rf"/{re.escape(UNIT_PREFIX)}({ENDPOINT_NAME_RULE})")
DOCKER_CONTAINERS = Path("/var/lib/docker/containers")
LAST_PORT = 65535


@dataclass(frozen=True)
class Listener:
    """A process listening on a TCP port, and the endpoint whose unit it belongs to."""

    pid: int | None
    process: str | None
    endpoint: str | None

    def describe(self) -> str:
        if self.pid is None:
            return self.process or "another process"
        return f"{self.process or 'process'} (pid {self.pid})"


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
        cgroup = (proc / str(pid) / "cgroup").read_text()
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
        record = json.loads((container / "config.v2.json").read_text())
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


def assign_ports(
    requests: Sequence[PortRequest],
    listeners: Mapping[int, Listener],
    first_port: int,
    approved: Mapping[str, int] | None = None,
) -> dict[str, int | EpycError]:
    """Explicit ports first (in name order), then "auto" ports: the approved one, the one
    the endpoint's unit listens on, else the first free from `first_port` up."""
    results: dict[str, int | EpycError] = {}
    holders = {port: name for name, port in sorted((approved or {}).items())}

    def held_by_other(port: int, name: str) -> str | None:
        holder = holders.get(port)
        return holder if holder is not None and holder != name else None

    claimed: dict[int, str] = {}
    for request in sorted(requests, key=lambda r: r.name):
        if request.port is None:
            continue
        holder = held_by_other(request.port, request.name)
        if holder is not None:
            results[request.name] = Refusal(
                f"port {request.port} is the port of approved endpoint {holder}",
                file=request.file,
                key="port",
                fix=f'choose another port or "auto", or `epycctl remove {holder}` first',
            )
            continue
        if request.port in claimed:
            results[request.name] = InputError(
                f"port {request.port} is also the port of endpoint {claimed[request.port]}",
                file=request.file,
                key="port",
                fix='choose another port or "auto"',
            )
            continue
        listener = _taken_on_host(request.port, request.name, listeners)
        if listener is not None:
            results[request.name] = Refusal(
                f"port {request.port} is in use on this host by {listener.describe()}",
                file=request.file,
                key="port",
                fix='choose a free port or "auto"',
            )
            continue
        claimed[request.port] = request.name
        results[request.name] = request.port
    explicit = {r.port for r in requests if r.port is not None}
    auto = sorted((r for r in requests if r.port is None), key=lambda r: r.name)
    for request in auto:
        kept = (approved or {}).get(request.name)
        if (
            kept is not None
            and kept not in claimed
            and _taken_on_host(kept, request.name, listeners) is None
        ):
            claimed[kept] = request.name
            results[request.name] = kept
    for request in auto:
        if request.name in results:
            continue
        held = sorted(
            port
            for port, listener in listeners.items()
            if listener.endpoint == request.name
            and port >= first_port
            and port not in claimed
            and port not in explicit
            and held_by_other(port, request.name) is None
        )
        if held:
            claimed[held[0]] = request.name
            results[request.name] = held[0]
    candidate = first_port
    for request in auto:
        if request.name in results:
            continue
        while candidate <= LAST_PORT and (
            candidate in claimed
            or candidate in explicit
            or held_by_other(candidate, request.name) is not None
            or _taken_on_host(candidate, request.name, listeners) is not None
        ):
            candidate += 1
        if candidate > LAST_PORT:
            results[request.name] = Refusal(
                f"no free port from {first_port} up", file=request.file, key="port"
            )
            continue
        claimed[candidate] = request.name
        results[request.name] = candidate
    return results
