"""The last minute of an instance's load, as `epycctl status NAME` shows it."""

from __future__ import annotations

import re

import pytest

from epycd.metrics.load import LoadWindow, Sample, load_of, parse_sample
from epycd.metrics.scrape import Reading, Target
from tests.metrics.servers import recorded


def recorded_counter(name: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", recorded(), re.M)
    assert found, name
    return float(found.group(1))


def exposition(tokens: float, running: float = 2.0) -> str:
    """The recorded real exposition with the token counters and running requests replaced."""
    text = re.sub(
        r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$", rf"\g<1> {tokens}", recorded(), flags=re.M
    )
    text = re.sub(r"^(vllm:prompt_tokens_total\{[^}]*\}) \S+$", r"\g<1> 0.0", text, flags=re.M)
    return re.sub(
        r"^(vllm:num_requests_running\{[^}]*\}) \S+$", rf"\g<1> {running}", text, flags=re.M
    )


def test_a_real_exposition_gives_the_load_values() -> None:
    sample = parse_sample(recorded(), at=5.0)
    expected = recorded_counter("vllm:prompt_tokens_total") + recorded_counter(
        "vllm:generation_tokens_total"
    )
    assert sample.tokens == expected > 0
    assert sample.running == recorded_counter("vllm:num_requests_running")
    assert sample.kv_cache_usage == recorded_counter("vllm:kv_cache_usage_perc")


def test_an_exposition_without_vllm_series_is_refused() -> None:
    with pytest.raises(ValueError, match="vllm:num_requests_running"):
        parse_sample("# a server that is not vLLM\nup 1\n", at=0.0)


def test_tokens_per_second_over_the_window_and_across_a_restart() -> None:
    steady = [Sample(at, 1, 0, 0.5, 100 + 20 * at) for at in (0.0, 10.0, 20.0)]
    load = load_of(0, steady)
    assert (load.tokens_per_second, load.window_seconds, load.running) == (20.0, 20.0, 1)
    restarted = [*steady, Sample(30.0, 0, 0, 0.0, 5.0), Sample(40.0, 0, 0, 0.0, 45.0)]
    assert load_of(0, restarted).tokens_per_second == 4.0
    assert load_of(0, restarted[-1:]).tokens_per_second is None


def reading(tokens: float, instance: str = "0", up: bool = True) -> Reading:
    target = Target("tiny", instance, "0", "0", "http://127.0.0.1:1/metrics")
    return Reading(target, 0.01, exposition(tokens) if up else None, "" if up else "refused")


def test_the_window_keeps_a_minute_and_forgets_what_it_no_longer_reads() -> None:
    window = LoadWindow(window_s=60)
    for at in range(0, 100, 10):
        window.add([reading(tokens=15.0 * at)], now=float(at))
    [load] = window.loads("tiny")
    assert (load.tokens_per_second, load.window_seconds, load.running) == (15.0, 60.0, 2.0)
    window.add([reading(tokens=1500.0), reading(tokens=0.0, instance="1")], now=100.0)
    assert [each.instance for each in window.loads("tiny")] == [0, 1]
    window.add([reading(tokens=0.0, instance="1")], now=110.0)
    assert [each.instance for each in window.loads("tiny")] == [1]
    window.add([reading(tokens=0.0, instance="1", up=False)], now=120.0)
    assert window.loads("tiny") == []
    assert window.loads("other") == []
