"""The gateway's use by client and model, in epycd's /metrics (docs/gateway.md, "Metrics").

HAProxy counts each client's requests to each model, and the 4xx and 5xx answers among
them, in its `usage` stick table; its metrics frontend answers the table as JSON at
`/usage` (epycd.gateway.haproxy). HAProxy's own exporter, on the same frontend at
`/metrics`, has no label for the client, so these series come through epycd. The gateway
is read with the scrape's deadline, beside the instances; a gateway that does not answer
reads as down, with no usage series.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel

from epycd.errors import EpycError
from epycd.gateway.apply import read_approval
from epycd.listen import local_url
from epycd.metrics.scrape import fetch
from epycd.settings import Settings, parse_listen

PREFIX = "epyc_llm_gateway_"


class PairUse(BaseModel):
    """One client's use of one model: `key` is `client/model` (a client's name has no
    slash; a model's may)."""

    key: str
    requests: int
    client_errors: int
    server_errors: int
    answered: int = 0
    """Of its requests, those the endpoint answered (the gateway's own refusals are not)."""
    answer_ms: int = 0
    """Their milliseconds from the request's model known to the endpoint's response headers
    (a stream's first byte), summed."""

    @property
    def labels(self) -> list[str]:
        client, _, model = self.key.partition("/")
        return [client, model]


class Usage(BaseModel):
    usage: list[PairUse]


def usage_url(settings: Settings) -> str | None:
    """Where the approved gateway answers its usage; None without a gateway or metrics."""
    try:
        approval = read_approval(settings)
    except (EpycError, OSError, ValueError):  # a ValidationError is a ValueError
        return None
    if approval is None or not approval.metrics_listen:
        return None
    return f"{local_url(*parse_listen(approval.metrics_listen))}/usage"


def read_usage(url: str, deadline: float) -> Usage | str:
    """The gateway's usage, or why there is none, read before `deadline` (monotonic)."""
    with httpx.Client(trust_env=False) as client:
        try:
            return Usage.model_validate_json(fetch(client, url, deadline))
        except ValueError as error:  # ValidationError is one
            return str(error).splitlines()[0]


def usage_series(usage: Usage | str) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        f"{PREFIX}up", "1 when the gateway answered its usage within the deadline, else 0"
    )
    up.add_metric([], 0 if isinstance(usage, str) else 1)
    yield up
    if isinstance(usage, str):
        return
    labels = ["client", "model"]
    families = {
        "requests": CounterMetricFamily(
            f"{PREFIX}requests", "requests of a client to a model, refusals included",
            labels=labels,
        ),
        "client_errors": CounterMetricFamily(
            f"{PREFIX}client_errors", "of them, answered with a 4xx (403, 429 and the "
            "endpoint's own)", labels=labels,
        ),
        "server_errors": CounterMetricFamily(
            f"{PREFIX}server_errors", "of them, answered with a 5xx (503 while the endpoint "
            "is down, and the endpoint's own)", labels=labels,
        ),
    }  # fmt: skip
    latency = SummaryMetricFamily(
        f"{PREFIX}response_seconds",
        "the endpoint's answers to a client's requests to a model: seconds to its response "
        "headers (a stream's first byte; a cold start of an on-demand endpoint included)",
        labels=labels,
    )
    for pair in sorted(usage.usage, key=lambda p: p.key):
        families["requests"].add_metric(pair.labels, pair.requests)
        families["client_errors"].add_metric(pair.labels, pair.client_errors)
        families["server_errors"].add_metric(pair.labels, pair.server_errors)
        latency.add_metric(pair.labels, pair.answered, pair.answer_ms / 1000)
    yield from families.values()
    yield latency


def gateway_series(url: str | None, deadline_s: float) -> list[Metric]:
    """The usage series of the gateway at `url`; none without a gateway."""
    if url is None:
        return []
    return list(usage_series(read_usage(url, time.monotonic() + deadline_s)))
