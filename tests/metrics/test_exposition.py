"""epycd's /metrics as Prometheus reads it: served on metrics_listen, accepted by Debian's
own promtool, its series right for each endpoint, and bounded by a hung instance."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epycd.metrics.server import MetricsServer
from epycd.plan.endpoint import Plan
from epycd.sizes import GIB
from epycd.status.machine import EndpointStatus
from tests.metrics.conftest import promtool, single
from tests.metrics.servers import answering, closed_port, hung, recorded

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
Serve = Callable[[Sequence[EndpointStatus], Mapping[str, Plan]], str]
"""Serve these statuses and approved plans on a free loopback port; the /metrics URL."""


def free_port() -> int:
    return closed_port()


def ready(name: str, since: datetime | None = None) -> EndpointStatus:
    return EndpointStatus(
        name=name,
        state="ready",
        unit=f"epyc-llm-{name}.service",
        ready_since=since,
        startup_seconds=41.5,
        restarts=1,
    )


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[MetricsServer] = []

    def start(statuses: Sequence[EndpointStatus], plans: Mapping[str, Plan]) -> str:
        server = MetricsServer(lambda: (statuses, plans))
        listen = f"127.0.0.1:{free_port()}"
        server.apply(listen)
        assert server.server is not None, f"did not listen on {listen}"
        servers.append(server)
        return f"http://{listen}/metrics"

    yield start
    for server in servers:
        server.stop()


def samples(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    matches = [v for (n, have), v in found.items() if n == name and wanted <= have]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_the_exposition_passes_promtool_and_carries_every_endpoint(serve: Serve) -> None:
    since = datetime.now(UTC) - timedelta(seconds=120)
    with answering() as port:
        plan = single("tiny", port)
        waiting = EndpointStatus(
            name="draft", state="pending-approval", unit="epyc-llm-draft.service"
        )
        url = serve([ready("tiny", since), waiting], {"tiny": plan})
        text = httpx.get(url, timeout=5).text
    checked = subprocess.run(
        [str(promtool()), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = samples(text)
    assert value(found, "epyc_llm_endpoint_state", endpoint="tiny", state="ready") == 1
    assert value(found, "epyc_llm_endpoint_state", endpoint="tiny", state="failed") == 0
    assert value(found, "epyc_llm_endpoint_state", endpoint="draft", state="pending-approval") == 1
    assert not [
        k for k in found if k[0] == "epyc_llm_endpoint_instances" and ("endpoint", "draft") in k[1]
    ]
    labels = {"endpoint": "tiny", "vllm_instance": "0", "socket": "0", "numa_node": "0,1"}
    assert value(found, "epyc_llm_instance_up", **labels) == 1
    assert value(found, "epyc_llm_endpoint_instances_ready", endpoint="tiny") == 1
    assert value(found, "epyc_llm_endpoint_restarts", endpoint="tiny") == 1
    assert value(found, "epyc_llm_instance_startup_seconds", **labels) == 41.5
    assert (
        value(found, "epyc_llm_instance_ready_since_timestamp_seconds", **labels)
        == since.timestamp()
    )
    assert 120 <= value(found, "epyc_llm_instance_seconds_since_ready", **labels) < 180
    decisions = plan.decisions
    assert value(found, "epyc_llm_plan_kv_cache_bytes", **labels) == decisions.kv_cache_gb * GIB
    assert value(found, "epyc_llm_plan_cores", **labels) == 48  # host_vllm(): cpus 0-47
    vllm_said = samples(recorded())
    for name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
        expected = value(vllm_said, name, model_name="tiny")
        assert value(found, name.replace(":", "_"), model_name="tiny", **labels) == expected
    assert value(found, "process_resident_memory_bytes") > 0


def test_a_hung_instance_reads_as_down_and_the_scrape_stays_under_a_second(serve: Serve) -> None:
    with answering() as good, hung() as frozen:
        plans = {"good": single("good", good), "frozen": single("frozen", frozen)}
        url = serve([ready("good"), ready("frozen")], plans)
        started = time.monotonic()
        text = httpx.get(url, timeout=5).text
        took = time.monotonic() - started
    assert took < 1.0, took
    found = samples(text)
    assert value(found, "epyc_llm_instance_up", endpoint="frozen") == 0
    assert value(found, "epyc_llm_instance_up", endpoint="good") == 1
    assert value(found, "epyc_llm_instance_scrape_duration_seconds", endpoint="frozen") >= 0.4
    vllm = {labels for name, labels in found if name.startswith("vllm_")}
    assert vllm and all(("endpoint", "good") in labels for labels in vllm)


def test_a_dead_instance_reads_as_down(serve: Serve) -> None:
    url = serve([ready("gone")], {"gone": single("gone", closed_port())})
    found = samples(httpx.get(url, timeout=5).text)
    assert value(found, "epyc_llm_instance_up", endpoint="gone") == 0


def test_a_set_has_series_per_instance_with_its_socket_and_node(
    serve: Serve, docker_set: Plan
) -> None:
    assert docker_set.instance_set is not None
    members = docker_set.decisions.members
    status = EndpointStatus(name="multi", state="degraded", unit="epyc-llm-multi.service")
    url = serve([status], {"multi": docker_set})
    found = samples(httpx.get(url, timeout=5).text)
    assert value(found, "epyc_llm_endpoint_instances", endpoint="multi") == len(members)
    assert value(found, "epyc_llm_endpoint_instances_ready", endpoint="multi") == 0
    for member in members:
        labels = {
            "endpoint": "multi",
            "vllm_instance": str(member.instance),
            "socket": str(member.socket),
            "numa_node": ",".join(map(str, member.numa_nodes)),
        }
        assert value(found, "epyc_llm_plan_max_num_seqs", **labels) == member.max_num_seqs
        assert value(found, "epyc_llm_plan_kv_cache_bytes", **labels) == member.kv_cache_gb * GIB
        assert value(found, "epyc_llm_instance_up", **labels) == 0  # nothing listens


def test_metrics_listen_empty_serves_nothing_and_a_taken_port_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = MetricsServer(lambda: ([], {}))
    server.apply("")
    assert server.server is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with caplog.at_level(logging.ERROR, logger="epycd"):
            server.apply(listen)
    assert server.server is None
    [message] = [r.getMessage() for r in caplog.records]
    assert listen in message and "metrics_listen" in message and "epycd.conf" in message
    port = free_port()
    server.apply(f"127.0.0.1:{port}")
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
        server.apply("")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        server.stop()


def test_before_the_first_status_an_approved_endpoint_has_its_series(serve: Serve) -> None:
    """epycd serves /metrics before its first reading of the endpoints' state (the daemon
    reads the approved plans first): the approved endpoint and its instance are there."""
    with answering() as port:
        url = serve([], {"tiny": single("tiny", port)})
        found = samples(httpx.get(url, timeout=5).text)
    labels = {"endpoint": "tiny", "vllm_instance": "0", "socket": "0", "numa_node": "0,1"}
    assert value(found, "epyc_llm_endpoint_instances", endpoint="tiny") == 1
    assert value(found, "epyc_llm_endpoint_instances_ready", endpoint="tiny") == 0
    assert value(found, "epyc_llm_plan_cores", **labels) == 48
    assert value(found, "epyc_llm_instance_up", **labels) == 1
    assert value(found, "vllm_num_requests_running", model_name="tiny", **labels) == 0
