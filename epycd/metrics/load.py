"""The last minute of each instance's load, for `epycctl status NAME`.

The daemon reads the ready instances' /metrics at each refresh (every 10 s) and keeps
their readings for a minute: requests running and waiting and KV cache usage are the
last reading's, tokens/s is the growth of the prompt + generation token counters over
the readings in the window (an instance that restarted counts from its restart on). The
names are the engine's (`epycd.engines`); an engine that exports no KV cache usage has it
null.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from epycd.health import engine_metrics_in, metric_sums
from epycd.metrics.scrape import Reading, Target
from epycd.status.instances import InstanceLoad

WINDOW_S = 60.0


@dataclass(frozen=True)
class Sample:
    at: float
    running: float
    waiting: float
    kv_cache_usage: float | None
    tokens: float


def parse_sample(text: str, at: float) -> Sample:
    """The load values of one exposition, of whichever engine wrote it (`ServerMetrics.load`;
    no KV cache use where the engine exports none). Only the lines for them are parsed
    (vLLM's exposition is about 50 kB): reading every 10 s must stay cheap. ValueError when
    one is missing."""
    metrics = engine_metrics_in(text)
    sums = wanted_sums(text, metrics.load)
    kv = sums[metrics.kv_usage] if metrics.kv_usage else None
    tokens = sum(sums[name] for name in metrics.tokens)
    return Sample(at, sums[metrics.running], sums[metrics.waiting], kv, tokens)


def wanted_sums(text: str, wanted: tuple[str, ...]) -> dict[str, float]:
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    return metric_sums("\n".join(lines) + "\n", wanted)


def load_of(instance: int, samples: Sequence[Sample]) -> InstanceLoad:
    last = samples[-1]
    first = last
    for sample in reversed(samples[:-1]):
        if sample.tokens > first.tokens:
            break  # the counters went back: the instance restarted after this one
        first = sample
    span = last.at - first.at
    rate = (last.tokens - first.tokens) / span if span > 0 else None
    return InstanceLoad(
        instance=instance,
        running=last.running,
        waiting=last.waiting,
        kv_cache_usage=last.kv_cache_usage,
        tokens_per_second=None if rate is None else round(rate, 2),
        window_seconds=round(span, 1),
    )


class LoadWindow:
    """Readings per instance over the last `window_s` seconds."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.samples: dict[Target, deque[Sample]] = {}

    def add(self, readings: Sequence[Reading], now: float) -> None:
        """Keep each answering instance's reading; forget instances not read this time."""
        read = {reading.target for reading in readings}
        for target in [target for target in self.samples if target not in read]:
            del self.samples[target]
        for reading in readings:
            kept = self.samples.setdefault(reading.target, deque())
            try:
                if reading.text is None:
                    raise ValueError(reading.error)
                kept.append(parse_sample(reading.text, now))
            except ValueError:
                kept.clear()
                continue
            while kept and now - kept[0].at > self.window_s:
                kept.popleft()

    def loads(self, endpoint: str) -> list[InstanceLoad]:
        return [
            load_of(int(target.vllm_instance), list(kept))
            for target, kept in sorted(self.samples.items(), key=lambda item: item[0].vllm_instance)
            if target.endpoint == endpoint and kept
        ]
