"""epycd's own series, from the endpoints' status and their approved plans. Pure.

Per endpoint: its state (one series per state, 1 for the one it is in), its instances
and how many are ready, and the failed runs systemd restarted (within the start limit
interval, as `epycctl status` counts them). Per server process (a vLLM instance or a
llama-server), labelled like its own series (`epycd.metrics.scrape.LABELS`): when it became
ready and its last start-up, and the plan's sizing (cores, KV pool, max_num_seqs,
context).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from epycd.host.cpulist import parse_cpulist
from epycd.metrics.scrape import LABELS, Dropped, Reading, Target, targets
from epycd.plan.endpoint import Plan
from epycd.plan.model import AnyServer
from epycd.sizes import GIB
from epycd.status.machine import COUNT_WORDS, EndpointStatus

STATES = tuple(kind for kind, _word in COUNT_WORDS)
"""Every state an endpoint can be in (`failed:PHASE` counts as `failed`)."""
PREFIX = "epyc_llm_"


@dataclass(frozen=True)
class Instance:
    """One server process of an approved endpoint, with its status where there is one."""

    target: Target
    process: AnyServer
    ready: bool
    ready_since: datetime | None
    startup_seconds: float | None


def instances(status: EndpointStatus | None, plan: Plan) -> Iterator[Instance]:
    """The plan's server processes; none is ready while there is no status yet (epycd
    serves /metrics before its first reading of the endpoints' state)."""
    by_number = {entry.instance: entry for entry in status.instances} if status else {}
    processes = list(plan.decisions.servers)
    for target, process in zip(targets([plan]), processes, strict=True):
        entry = by_number.get(int(target.vllm_instance))
        if status is None:
            yield Instance(target, process, False, None, None)
        elif entry is not None:
            yield Instance(
                target, process, entry.state == "ready", entry.ready_since, entry.startup_seconds
            )
        elif plan.instance_set is None:
            ready = status.state == "ready"
            yield Instance(target, process, ready, status.ready_since, status.startup_seconds)
        else:
            yield Instance(target, process, False, None, None)


def gauge(name: str, documentation: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))


def endpoint_series(
    statuses: Sequence[EndpointStatus], plans: Mapping[str, Plan], now: datetime
) -> list[Metric]:
    """The series of every endpoint `statuses` lists, and of every approved one (`plans`):
    before the daemon's first status, an approved endpoint has its plan's series."""
    state = gauge("endpoint_state", "1 for the state the endpoint is in", ("endpoint", "state"))
    count = gauge("endpoint_instances", "server instances of the approved plan", ("endpoint",))
    ready = gauge("endpoint_instances_ready", "server instances ready", ("endpoint",))
    restarts = gauge(
        "endpoint_restarts",
        "failed runs of its units that systemd restarted, within the start limit interval",
        ("endpoint",),
    )
    since = gauge(
        "instance_ready_since_timestamp_seconds", "when the instance became ready", LABELS
    )
    age = gauge("instance_seconds_since_ready", "seconds since the instance became ready", LABELS)
    startup = gauge(
        "instance_startup_seconds", "the last start-up: load, /v1/models, one request", LABELS
    )
    cores = gauge("plan_cores", "CPUs the instance is pinned to", LABELS)
    kv = gauge("plan_kv_cache_bytes", "the KV cache pool the plan gives the server", LABELS)
    seqs = gauge(
        "plan_max_num_seqs",
        "the requests the plan lets the server compute at once (0: the engine's default)",
        LABELS,
    )
    context = gauge("plan_max_model_len", "the context length the plan gives the server", LABELS)
    for status in statuses:
        for kind in STATES:
            state.add_metric([status.name, kind], float(status.kind == kind))
    by_name = {status.name: status for status in statuses}
    for name, plan in plans.items():
        known = by_name.get(name)
        if known is not None:
            restarts.add_metric([name], known.restarts)
        found = list(instances(known, plan))
        count.add_metric([name], len(found))
        ready.add_metric([name], sum(instance.ready for instance in found))
        for instance in found:
            values = list(instance.target.labels.values())
            process = instance.process
            cores.add_metric(values, len(parse_cpulist(process.cpus)))
            kv.add_metric(values, process.kv_cache_gb * GIB)
            seqs.add_metric(values, process.max_num_seqs)
            context.add_metric(values, process.max_model_len)
            if instance.ready and instance.ready_since is not None:
                since.add_metric(values, instance.ready_since.timestamp())
                age.add_metric(values, max((now - instance.ready_since).total_seconds(), 0.0))
            if instance.ready and instance.startup_seconds is not None:
                startup.add_metric(values, instance.startup_seconds)
    cold = cold_start_series(by_name, plans)
    return [state, count, ready, restarts, since, age, startup, cores, kv, seqs, context, *cold]


def cold_start_series(
    statuses: Mapping[str, EndpointStatus], plans: Mapping[str, Plan]
) -> list[Metric]:
    """Each approved on-demand endpoint's cold starts since boot and their start-up seconds,
    as its supervisor counts them (`SupervisorStatus.ready_runs`)."""
    starts = CounterMetricFamily(
        PREFIX + "cold_starts",
        "on-demand starts that passed the health gate, since boot",
        labels=["endpoint"],
    )
    seconds = CounterMetricFamily(
        PREFIX + "cold_start_seconds",
        "the start-ups of those starts (load, /v1/models, one request), summed",
        labels=["endpoint"],
    )
    for name, plan in plans.items():
        if plan.decisions.on_demand is None:
            continue
        status = statuses.get(name)
        counted = status.cold_starts if status is not None else None
        starts.add_metric([name], counted.count if counted else 0)
        seconds.add_metric([name], counted.seconds if counted else 0.0)
    return [starts, seconds]


def reading_series(readings: Sequence[Reading]) -> list[Metric]:
    """Whether each instance answered its /metrics, and how long it took."""
    up = gauge("instance_up", "1 when the instance's own /metrics answered in time", LABELS)
    took = gauge(
        "instance_scrape_duration_seconds", "how long the instance's /metrics took", LABELS
    )
    for reading in readings:
        values = list(reading.target.labels.values())
        up.add_metric(values, float(reading.up))
        took.add_metric(values, round(reading.seconds, 6))
    return [up, took]


def dropped_series(readings: Sequence[Reading], totals: Mapping[Target, Dropped]) -> list[Metric]:
    """Per instance read, the families and series of its own /metrics that epycd did not
    forward since it started (`totals`): they clashed with a family forwarded before them or
    were not valid. Not 0 means something other than the server answers on its port, or the
    server's exposition changed shape."""
    families = CounterMetricFamily(
        PREFIX + "instance_dropped_families",
        "families of the instance's /metrics not forwarded: they clash or are not valid",
        labels=list(LABELS),
    )
    samples = CounterMetricFamily(
        PREFIX + "instance_dropped_samples",
        "series of the instance's /metrics not forwarded: they clash or are not valid",
        labels=list(LABELS),
    )
    for reading in readings:
        total = totals.get(reading.target, Dropped())
        values = list(reading.target.labels.values())
        families.add_metric(values, total.families)
        samples.add_metric(values, total.samples)
    return [families, samples]
