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

import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from epycd.engines import metric_prefixes
from epycd.listen import local_url
from epycd.plan.endpoint import Plan

DEADLINE_S = 0.5
"""The bound of one instance's answer; all are read at once, so it bounds the scrape too."""
MAX_BYTES = 4 * 1024 * 1024
"""vLLM's /metrics is about 50 kB per instance; more is not an exposition to forward."""
MAX_LINES = 10_000
"""vLLM's /metrics is about 600 lines for one model. Parsing and writing cost about 30 µs a
line, so this bounds what one instance can cost each scrape of epycd (about 0.3 s of CPU,
not the 10 s of 8 MiB of series), whatever answers on its port."""
ENGINE_PREFIXES = metric_prefixes()
"""The engines' own families, which are forwarded (`ServerMetrics.prefix`)."""
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
        for number, process in enumerate(list(plan.decisions.servers)):
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
    """The body at `url`, read before `deadline` (monotonic), streamed and given up past
    `MAX_BYTES` or `MAX_LINES`; ValueError saying why not."""
    remaining = deadline - time.monotonic()
    try:
        with client.stream("GET", url, timeout=max(remaining, 0.001)) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = bytearray()
            lines = 0
            for chunk in response.iter_bytes():
                body += chunk
                lines += chunk.count(b"\n")
                if len(body) > MAX_BYTES:
                    raise ValueError(f"more than {MAX_BYTES} bytes")
                if lines > MAX_LINES:
                    raise ValueError(f"more than {MAX_LINES} lines")
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


SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": (),
    "unknown": (),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
}
"""The types forwarded (vLLM's and llama-server's, and what Prometheus's text format has),
and the names a family of each type takes beside its own: its samples' and its `_created`.
Two families may not share one of these names (a gauge named like a histogram's `_count`),
or Prometheus's parser refuses the whole answer."""
NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
"""A name Prometheus's text format takes as it is (prometheus_client would escape others)."""


@dataclass
class Dropped:
    """What one instance's exposition had that was not forwarded: its families that clash
    with a family forwarded before them, or are not valid, and their series."""

    families: int = 0
    samples: int = 0

    def add(self, family: Metric) -> None:
        self.families += 1
        self.samples += len(family.samples)


def names_taken(name: str, kind: str) -> tuple[str, ...]:
    return (name, *(name + suffix for suffix in SUFFIXES[kind]))


def valid_labels(labels: dict[str, str]) -> bool:
    """Label names Prometheus takes (`__` is its own)."""
    return all(NAME.fullmatch(key) and not key.startswith("__") for key in labels)


@dataclass
class Forwarded:
    """Every reading's families, one per name, in the order first seen: the first family
    to take a name (its own or a derived one: `SUFFIXES`) keeps it, and a later family
    that differs in type or takes one of its names is dropped, so that no instance, nor
    several together, can make epycd's whole answer invalid."""

    families: dict[str, Metric] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    series: set[tuple[str, frozenset[tuple[str, str]]]] = field(default_factory=set)
    dropped: dict[Target, Dropped] = field(default_factory=dict)

    def add(self, reading: Reading) -> None:
        dropped = self.dropped.setdefault(reading.target, Dropped())
        if reading.text is None:
            return
        families = parsed(reading.text)
        if families is None:
            dropped.families += 1  # an exposition that does not parse gives nothing
            return
        untotalled = untotalled_counters(reading.text)
        for family in families:
            if forwarded(family, untotalled):
                self.add_family(renamed(family, reading.target, dropped), dropped)

    def add_family(self, family: Metric, dropped: Dropped) -> None:
        kept = self.families.get(family.name)
        if kept is None and self.claim(family):
            kept = self.families[family.name] = Metric(
                family.name, family.documentation, family.type
            )
        if kept is None or kept.type != family.type:
            dropped.add(family)
            return
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            if key in self.series:
                dropped.samples += 1
                continue
            self.series.add(key)
            kept.samples.append(sample)

    def claim(self, family: Metric) -> bool:
        """Take the family's names, unless it is not a valid family or one is taken."""
        if family.type not in SUFFIXES or not NAME.fullmatch(family.name):
            return False
        names = names_taken(family.name, family.type)
        if self.taken.intersection(names):
            return False
        self.taken.update(names)
        return True


def parsed(text: str) -> list[Metric] | None:
    """The exposition's families as prometheus_client's parser reads them; None when it
    does not parse (at most `MAX_LINES` lines were read)."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError):
        return None


def renamed(family: Metric, target: Target, dropped: Dropped) -> Metric:
    """The family under its exported name, with the target's labels, without `_created`
    (left out, see above) and without the samples Prometheus's format would not take as
    they are (counted in `dropped`): a name that is not the family's own or a derived
    one, a label name it refuses."""
    copy = Metric(exported_name(family.name), family.documentation, family.type)
    names = set(names_taken(copy.name, family.type)) if family.type in SUFFIXES else set()
    for sample in family.samples:
        name = exported_name(sample.name)
        if name.endswith("_created"):
            continue
        if name not in names or not valid_labels(sample.labels):
            dropped.samples += 1
            continue
        labels = {**sample.labels, **target.labels}
        copy.add_sample(name, labels, sample.value, sample.timestamp, sample.exemplar)
    return copy


def forward(readings: Iterable[Reading]) -> Forwarded:
    """The families of every reading, in order, and what each instance had dropped."""
    found = Forwarded()
    for reading in readings:
        found.add(reading)
    return found


def relabelled(reading: Reading) -> list[Metric]:
    """The reading's server families, renamed for Prometheus and labelled with the target.
    An exposition that does not parse gives nothing (the instance still reads as up)."""
    return list(forward([reading]).families.values())
