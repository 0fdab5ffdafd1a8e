"""The `/metrics` endpoint: epycd's own series and every instance's, in one scrape.

prometheus_client's WSGI app answers it from a threading HTTP server of epycd's own thread;
each request reads the daemon's latest status and approved plans and scrapes the instances
then (`epycd.metrics.scrape`, bounded), so nothing runs between scrapes. The server is
bounded too, since any local process can be its client: at most `MAX_CONNECTIONS` at once,
each with `CLIENT_TIMEOUT_S` to send its request and for each write of the answer, and one
scrape at a time (each holds every instance's exposition). Idle clients cannot lock a scrape
out: a connection past the cap takes the slot of the oldest client that has not yet sent its
request (which is closed), and is closed itself only when every slot serves a request.
Binding is not fatal: epycd keeps its endpoints running without metrics and says why, naming
`metrics_listen`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from epycd.metrics.gateway import gateway_series
from epycd.metrics.scrape import DEADLINE_S, Dropped, Target, forward, read_all, targets
from epycd.metrics.series import dropped_series, endpoint_series, reading_series
from epycd.plan.endpoint import Plan
from epycd.settings import parse_listen
from epycd.status.machine import EndpointStatus

log = logging.getLogger("epycd")

Source = Callable[[], tuple[Sequence[EndpointStatus], Mapping[str, Plan]]]
"""The daemon's latest statuses and its approved plans by endpoint name."""
GatewaySource = Callable[[], str | None]
"""Where the approved gateway answers its usage (epycd.metrics.gateway.usage_url), or None."""


def no_gateway() -> None:
    return None


MAX_CONNECTIONS = 8
"""Clients served at once: Prometheus scrapes one at a time, a person's curl is another."""
CLIENT_TIMEOUT_S = 5.0
"""How long a client has to send its whole request, and each write of the answer may wait
on it: an idle or dripping client (slowloris) is cut off, not kept for ever."""


class EndpointCollector(Collector):
    def __init__(
        self, source: Source, deadline_s: float = DEADLINE_S, gateway: GatewaySource = no_gateway
    ) -> None:
        self.source = source
        self.deadline_s = deadline_s
        self.gateway = gateway
        self.dropped: dict[Target, Dropped] = {}
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        statuses, plans = self.source()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway") as pool:
            gateway = pool.submit(gateway_series, self.gateway(), self.deadline_s)
            readings = read_all(targets(plans.values()), self.deadline_s)
            gateway_families = gateway.result()
        found = forward(readings)
        with self.lock:
            for target, dropped in found.dropped.items():
                total = self.dropped.setdefault(target, Dropped())
                total.families += dropped.families
                total.samples += dropped.samples
            totals = {target: Dropped(d.families, d.samples) for target, d in self.dropped.items()}
        yield from endpoint_series(statuses, plans, datetime.now(UTC))
        yield from reading_series(readings)
        yield from dropped_series(readings, totals)
        yield from found.families.values()
        yield from gateway_families

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to describe ahead: registering must not scrape


def registry(
    source: Source, deadline_s: float = DEADLINE_S, gateway: GatewaySource = no_gateway
) -> CollectorRegistry:
    found = CollectorRegistry(auto_describe=False)
    found.register(EndpointCollector(source, deadline_s, gateway))
    ProcessCollector(registry=found)
    return found


def one_at_a_time(app: WSGIApplication) -> WSGIApplication:
    """The app, answering one request at a time: a scrape holds every instance's parsed
    exposition until its answer is written, so parallel scrapes would add those up."""
    lock = threading.Lock()

    def serialized(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    return serialized


class ClientHandler(WSGIRequestHandler):
    """One client's request, read within `CLIENT_TIMEOUT_S` in all (a timer shuts the
    connection down after that), its answer written with that timeout on each write."""

    server: BoundedServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.client_timeout_s)
        self.cutoff = threading.Timer(self.server.client_timeout_s, self.cut_off)
        self.cutoff.daemon = True
        self.cutoff.start()

    def cut_off(self) -> None:
        cut_off(self.connection)

    def parse_request(self) -> bool:
        """The request line and headers are read: the rest is bounded by the timeout, and
        the client is no longer idle (`BoundedServer.admit` does not close it)."""
        parsed = super().parse_request()
        self.cutoff.cancel()
        self.server.serving(self.connection)
        return parsed

    def finish(self) -> None:
        self.cutoff.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def cut_off(connection: socket.socket) -> None:
    """Shut the connection down: its handler's next read or write ends."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per client, at most `max_connections` of them counted: a connection past
    them takes the slot of the oldest idle client (connected, its request not yet read),
    which is cut off, so idle clients, however many, never keep a scrape out; only when
    every slot serves a request is the new connection closed at once."""

    daemon_threads = True
    request_queue_size = 64
    """The listen backlog: a burst of connections waits to be accepted (and sorted out by
    `admit`) rather than being dropped by the kernel before a scrape's turn."""

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        *,
        max_connections: int,
        client_timeout_s: float,
    ) -> None:
        self.address_family = family
        self.client_timeout_s = client_timeout_s
        self.max_connections = max_connections
        self.slots_lock = threading.Lock()
        self.idle: dict[socket.socket, None] = {}
        """Clients in a slot whose request is not read yet, oldest first."""
        self.busy: set[socket.socket] = set()
        """Clients in a slot whose request is read (served or being answered)."""
        super().__init__(address, ClientHandler)

    def admit(self, request: socket.socket) -> bool:
        """Give `request` a slot, cutting off the oldest idle client when all are taken;
        False when every slot serves a request."""
        with self.slots_lock:
            if len(self.idle) + len(self.busy) >= self.max_connections:
                if not self.idle:
                    return False
                oldest = next(iter(self.idle))
                del self.idle[oldest]
                cut_off(oldest)
            self.idle[request] = None
            return True

    def serving(self, request: socket.socket) -> None:
        """`request`'s request is read: it is no longer idle."""
        with self.slots_lock:
            if self.idle.pop(request, False) is None:
                self.busy.add(request)

    def release(self, request: socket.socket) -> None:
        with self.slots_lock:
            self.idle.pop(request, None)
            self.busy.discard(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.admit(request):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.release(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client cut off or gone: said at debug level, not as a traceback on stderr."""
        log.debug("metrics: a client of /metrics failed", exc_info=True)


def serve(
    address: str, port: int, app: WSGIApplication, *, max_connections: int, client_timeout_s: float
) -> tuple[BoundedServer, threading.Thread]:
    """The server listening on `address`:`port` (IPv4 or IPv6), serving from its own thread."""
    family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server = BoundedServer(
        (str(sockaddr[0]), port),
        family,
        max_connections=max_connections,
        client_timeout_s=client_timeout_s,
    )
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


class MetricsServer:
    """The listening server of `metrics_listen`, started, moved or stopped as it changes."""

    def __init__(
        self,
        source: Source,
        *,
        gateway: GatewaySource = no_gateway,
        max_connections: int = MAX_CONNECTIONS,
        client_timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> None:
        self.source = source
        self.gateway = gateway
        self.max_connections = max_connections
        self.client_timeout_s = client_timeout_s
        self.listen = ""
        self.server: WSGIServer | None = None
        self.thread: threading.Thread | None = None

    def apply(self, listen: str) -> None:
        if listen == self.listen and (self.server is not None or not listen):
            return
        self.stop()
        self.listen = listen
        if not listen:
            return
        address, port = parse_listen(listen)
        try:
            self.server, self.thread = serve(
                address,
                port,
                one_at_a_time(make_wsgi_app(registry(self.source, gateway=self.gateway))),
                max_connections=self.max_connections,
                client_timeout_s=self.client_timeout_s,
            )
        except OSError as exc:
            log.error(
                "metrics: cannot listen on %s (metrics_listen in epycd.conf): %s; epycd runs "
                "without /metrics. Free the port, or choose another address or port (and allow "
                "it in epycd.service with a drop-in: SocketBindAllow=, IPAddressAllow=)",
                listen,
                exc.strerror or exc,
            )
            return
        log.info("metrics: serving Prometheus metrics on http://%s/metrics", listen)

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.server = self.thread = None
