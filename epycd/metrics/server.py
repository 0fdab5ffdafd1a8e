"""The `/metrics` endpoint: epycd's own series and every instance's, in one scrape.

prometheus_client serves it from its own thread (a small threading HTTP server); each
request reads the daemon's latest status and approved plans and scrapes the instances then
(`epycd.metrics.scrape`, bounded), so nothing runs between scrapes. Binding is not fatal:
epycd keeps its endpoints running without metrics and says why, naming `metrics_listen`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from epycd.metrics.scrape import DEADLINE_S, Reading, read_all, relabelled, targets
from epycd.metrics.series import endpoint_series, reading_series
from epycd.plan.model import Plan
from epycd.settings import parse_listen
from epycd.status.machine import EndpointStatus

log = logging.getLogger("epycd")

Source = Callable[[], tuple[Sequence[EndpointStatus], Mapping[str, Plan]]]
"""The daemon's latest statuses and its approved plans by endpoint name."""


def merged(families: Iterable[Metric]) -> list[Metric]:
    """One family per name: the same vLLM family read from several instances."""
    by_name: dict[str, Metric] = {}
    for family in families:
        kept = by_name.setdefault(
            family.name, Metric(family.name, family.documentation, family.type)
        )
        kept.samples.extend(family.samples)
    return list(by_name.values())


def instance_families(readings: Sequence[Reading]) -> list[Metric]:
    return merged(family for reading in readings for family in relabelled(reading))


class EndpointCollector(Collector):
    def __init__(self, source: Source, deadline_s: float = DEADLINE_S) -> None:
        self.source = source
        self.deadline_s = deadline_s

    def collect(self) -> Iterator[Metric]:
        statuses, plans = self.source()
        readings = read_all(targets(plans.values()), self.deadline_s)
        yield from endpoint_series(statuses, plans, datetime.now(UTC))
        yield from reading_series(readings)
        yield from instance_families(readings)

    def describe(self) -> Iterable[Metric]:
        return []  # nothing to describe ahead: registering must not scrape


def registry(source: Source, deadline_s: float = DEADLINE_S) -> CollectorRegistry:
    found = CollectorRegistry(auto_describe=False)
    found.register(EndpointCollector(source, deadline_s))
    ProcessCollector(registry=found)
    return found


class MetricsServer:
    """The listening server of `metrics_listen`, started, moved or stopped as it changes."""

    def __init__(self, source: Source) -> None:
        self.source = source
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
            self.server, self.thread = start_http_server(port, address, registry(self.source))
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
