"""Each vLLM instance's own `/metrics`, read on its port and labelled with where it runs.

An instance is read with a deadline on the whole answer (connect, headers and body), in
parallel with the others, so a slow, hung or dead instance costs at most the deadline and
never delays the rest: it reads as down (`epyc_llm_instance_up 0`) with no series of its
own. vLLM's names carry a colon (`vllm:num_requests_running`), which Prometheus keeps for
recording rules and `promtool check metrics` refuses, so they are exposed with an
underscore (`vllm_num_requests_running`); a family the linter would still refuse (a
histogram named `_total`) is left out rather than renamed into something vLLM never said,
and so are the `_created` gauges (when each series began: prometheus_client writes them,
Prometheus 2 does not read them), which are half of vLLM's families.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from epycd.listen import local_url
from epycd.plan.model import Plan, vllm_processes

DEADLINE_S = 0.5
"""The bound of one instance's answer; all are read at once, so it bounds the scrape too."""
MAX_BYTES = 8 * 1024 * 1024
"""vLLM's /metrics is about 50 kB per instance; more is not an exposition to forward."""
VLLM_PREFIX = "vllm:"
LABELS = ("endpoint", "vllm_instance", "socket", "numa_node")
"""`vllm_instance`, not `instance`: Prometheus sets `instance` itself, to the host:port it
scraped, and would rename ours to `exported_instance`."""


@dataclass(frozen=True)
class Target:
    """One vLLM instance and the labels its series get."""

    endpoint: str
    vllm_instance: str
    socket: str
    numa_node: str
    url: str = field(compare=False)

    @property
    def labels(self) -> dict[str, str]:
        values = (self.endpoint, self.vllm_instance, self.socket, self.numa_node)
        return dict(zip(LABELS, values, strict=True))


def targets(plans: Iterable[Plan]) -> list[Target]:
    """Every vLLM process of the plans: a set's instances, or the endpoint itself (instance
    0), at the address this machine reaches it on."""
    found = []
    for plan in plans:
        for number, process in enumerate(vllm_processes(plan.decisions)):
            instance = process.instance if process.instance is not None else number
            found.append(
                Target(
                    endpoint=plan.decisions.endpoint,
                    vllm_instance=str(instance),
                    socket=str(process.socket),
                    numa_node=",".join(map(str, process.numa_nodes)),
                    url=f"{local_url(process.host, process.port)}/metrics",
                )
            )
    return found


@dataclass(frozen=True)
class Reading:
    """One instance's answer: its exposition, or why there is none."""

    target: Target
    seconds: float
    text: str | None
    error: str = ""

    @property
    def up(self) -> bool:
        return self.text is not None


def fetch(client: httpx.Client, url: str, deadline: float) -> str:
    """The body at `url`, read before `deadline` (monotonic); ValueError saying why not."""
    remaining = deadline - time.monotonic()
    try:
        with client.stream("GET", url, timeout=max(remaining, 0.001)) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    raise ValueError(f"more than {MAX_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise ValueError("no whole answer within the deadline")
    except httpx.HTTPError as error:
        raise ValueError(f"{type(error).__name__}: {error}".rstrip(": ")) from None
    return body.decode("utf-8", errors="replace")


def read_one(client: httpx.Client, target: Target, deadline: float) -> Reading:
    started = time.monotonic()
    try:
        text = fetch(client, target.url, deadline)
    except ValueError as error:
        return Reading(target, time.monotonic() - started, None, str(error))
    return Reading(target, time.monotonic() - started, text)


def read_all(found: Sequence[Target], deadline_s: float = DEADLINE_S) -> list[Reading]:
    """Every target's reading, in the targets' order, within `deadline_s` in all. A reader
    still waiting at the deadline is left to time out on its own (its answer is dropped)."""
    if not found:
        return []
    deadline = time.monotonic() + deadline_s
    pool = ThreadPoolExecutor(max_workers=min(len(found), 16), thread_name_prefix="scrape")
    # plain HTTP to this machine's own addresses (`local_url`): no TLS context to build,
    # which would cost about 20 ms of CPU per read (certifi's bundle)
    client = httpx.Client(trust_env=False, verify=False)
    try:
        futures = [pool.submit(read_one, client, target, deadline) for target in found]
        wait(futures, timeout=max(deadline - time.monotonic(), 0) + 0.05)
        readings = []
        for target, future in zip(found, futures, strict=True):
            if future.done():
                readings.append(future.result())
            else:
                readings.append(Reading(target, deadline_s, None, "no answer within the deadline"))
        return readings
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()


def exported_name(name: str) -> str:
    return name.replace(":", "_")


def forwarded(family: Metric) -> bool:
    """A vLLM family that passes Prometheus's own lint once its colon is an underscore."""
    if not family.name.startswith(VLLM_PREFIX) or family.name.endswith("_created"):
        return False
    return family.type == "counter" or not family.name.endswith("_total")


def relabelled(reading: Reading) -> list[Metric]:
    """The reading's vLLM families, renamed for Prometheus and labelled with the target.
    An exposition that does not parse gives nothing (the instance still reads as up)."""
    if reading.text is None:
        return []
    labels = reading.target.labels
    out = []
    try:
        for family in text_string_to_metric_families(reading.text):
            if not forwarded(family):
                continue
            copy = Metric(exported_name(family.name), family.documentation, family.type)
            for sample in family.samples:
                copy.add_sample(
                    exported_name(sample.name),
                    {**sample.labels, **labels},
                    sample.value,
                    sample.timestamp,
                    sample.exemplar,
                )
            out.append(copy)
    except (ValueError, IndexError, KeyError, TypeError):
        return []
    return out
