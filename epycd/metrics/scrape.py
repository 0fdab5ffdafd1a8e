"""Each server's own `/metrics` (a vLLM instance's, or a llama-server's), read on its port and
labelled with where it runs.

An instance is read with a deadline on the whole answer (connect, headers and body), in
parallel with the others, so a slow, hung or dead instance costs at most the deadline and
never delays the rest: it reads as down (`epyc_llm_instance_up 0`) with no series of its
own. vLLM's and llama-server's names carry a colon (`vllm:num_requests_running`,
`llamacpp:requests_processing`), which Prometheus keeps for recording rules and `promtool
check metrics` refuses, so they are exposed with an underscore (`vllm_num_requests_running`);
a family the linter would still refuse (a histogram named `_total`, a counter without it) is
left out rather than renamed into something the server never said, and so are the
`_created` gauges (when each series began: prometheus_client writes them,
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
from epycd.plan.model import Plan, server_processes

DEADLINE_S = 0.5
"""The bound of one instance's answer; all are read at once, so it bounds the scrape too."""
MAX_BYTES = 8 * 1024 * 1024
"""vLLM's /metrics is about 50 kB per instance; more is not an exposition to forward."""
ENGINE_PREFIXES = ("vllm:", "llamacpp:")
"""The families of vLLM and of llama-server (`--metrics`) that are forwarded."""
LABELS = ("endpoint", "vllm_instance", "socket", "numa_node")
"""`vllm_instance`, not `instance`: Prometheus sets `instance` itself, to the host:port it
scraped, and would rename ours to `exported_instance`."""


@dataclass(frozen=True)
class Target:
    """One server process (a vLLM instance or a llama-server) and the labels its series get."""

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
    """Every server process of the plans: a set's instances, or the endpoint itself
    (instance 0), at the address this machine reaches it on."""
    found = []
    for plan in plans:
        for number, process in enumerate(server_processes(plan.decisions)):
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


def untotalled_counters(text: str) -> set[str]:
    """The counters the server declares without `_total` (llama-server's `n_tokens_max`):
    the parser would name their samples `_total`, a name the server never said."""
    declared = (line.split() for line in text.splitlines() if line.startswith("# TYPE "))
    return {
        words[2]
        for words in declared
        if words[3:] == ["counter"] and not words[2].endswith("_total")
    }


def forwarded(family: Metric, untotalled: set[str]) -> bool:
    """A server's family that passes Prometheus's own lint once its colon is an underscore,
    under the name the server gave it: nothing but a counter is named `_total`, and a
    counter is."""
    if not family.name.startswith(ENGINE_PREFIXES) or family.name.endswith("_created"):
        return False
    if family.type == "counter":
        return family.name not in untotalled
    return not family.name.endswith("_total")


def relabelled(reading: Reading) -> list[Metric]:
    """The reading's server families, renamed for Prometheus and labelled with the target.
    An exposition that does not parse gives nothing (the instance still reads as up)."""
    if reading.text is None:
        return []
    labels = reading.target.labels
    untotalled = untotalled_counters(reading.text)
    out = []
    try:
        for family in text_string_to_metric_families(reading.text):
            if not forwarded(family, untotalled):
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
