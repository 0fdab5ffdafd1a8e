"""Reading each instance's /metrics: labelled, renamed for Prometheus, and bounded."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from epycd.metrics.scrape import LABELS, Target, read_all, relabelled, targets
from epycd.plan.endpoint import Plan
from tests.metrics.conftest import single
from tests.metrics.servers import answering, closed_port, hung, recorded, trickling
from tests.render.fixtures import with_decisions


def target(port: int, endpoint: str = "tiny", instance: str = "0") -> Target:
    return Target(endpoint, instance, "1", "2,3", f"http://127.0.0.1:{port}/metrics")


def recorded_values() -> dict[str, float]:
    """vLLM's own sample name -> value in the recorded exposition (one engine, one model)."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(recorded())
        for sample in family.samples
        if not sample.labels.keys() - {"engine", "model_name"}
    }


def test_an_instance_is_read_renamed_and_labelled() -> None:
    with answering() as port:
        [reading] = read_all([target(port)])
    assert reading.up, reading.error
    families = relabelled(reading)
    assert families
    names = {sample.name for family in families for sample in family.samples}
    assert not any(":" in name for name in names)
    assert {"vllm_num_requests_running", "vllm_kv_cache_usage_perc"} <= names
    assert "vllm_time_to_first_token_seconds_bucket" in names
    assert "vllm_inter_token_latency_seconds_bucket" in names
    assert not any(name.startswith(("python_", "process_", "http_")) for name in names)
    for family in families:
        for sample in family.samples:
            assert {k: sample.labels[k] for k in LABELS} == target(port).labels, sample
            assert sample.labels.get("model_name", "tiny") == "tiny", "vLLM's labels are kept"
    generated = {
        sample.name: sample.value
        for family in families
        for sample in family.samples
        if sample.name.endswith("tokens_total")
    }
    vllm_said = recorded_values()
    assert generated["vllm_generation_tokens_total"] == vllm_said["vllm:generation_tokens_total"]
    assert generated["vllm_prompt_tokens_total"] == vllm_said["vllm:prompt_tokens_total"] > 0


def test_a_histogram_named_total_is_left_out() -> None:
    """promtool refuses a non-counter named _total (vLLM's iteration_tokens_total)."""
    assert "vllm:iteration_tokens_total" in {
        f.name for f in text_string_to_metric_families(recorded())
    }
    with answering() as port:
        [reading] = read_all([target(port)])
    assert not [f for f in relabelled(reading) if f.name.startswith("vllm_iteration_tokens")]


def test_dead_hung_and_trickling_instances_are_down_and_the_read_stays_bounded() -> None:
    with answering() as good, hung() as frozen, trickling() as slow:
        found = [target(good, "good"), target(frozen, "hung"), target(slow, "slow")]
        found.append(target(closed_port(), "dead"))
        started = time.monotonic()
        readings = read_all(found, deadline_s=0.5)
        took = time.monotonic() - started
    assert took < 1.0, took
    assert [r.target.endpoint for r in readings] == ["good", "hung", "slow", "dead"]
    assert [r.up for r in readings] == [True, False, False, False], readings
    for reading in readings[1:]:
        assert reading.error and relabelled(reading) == []
    assert "ConnectError" in readings[3].error


def test_an_answer_that_is_not_an_exposition_gives_no_series() -> None:
    with answering(lambda: "this is { not prometheus\n") as port:
        [reading] = read_all([target(port)])
    assert reading.up and relabelled(reading) == []


def test_a_set_is_read_instance_by_instance(docker_set: Plan) -> None:
    assert docker_set.decisions.kind == "set"
    members = docker_set.decisions.members
    found = targets([docker_set])
    assert len(found) == len(members) >= 2
    for member, each in zip(members, found, strict=True):
        assert each.endpoint == "multi"
        assert each.vllm_instance == str(member.instance)
        assert each.socket == str(member.socket)
        assert each.numa_node == ",".join(map(str, member.numa_nodes))
        assert each.url == f"http://127.0.0.1:{member.port}/metrics"
    assert len({each.url for each in found}) == len(found)
    assert len({each.socket for each in found}) == 2, "the Milan host has two sockets"


def test_an_endpoint_on_every_address_is_read_on_loopback() -> None:
    [each] = targets([single("tiny", 8000)])
    assert each.url == "http://127.0.0.1:8000/metrics"
    [each] = targets([with_decisions(single("tiny", 8000), host="0.0.0.0")])
    assert each.url == "http://127.0.0.1:8000/metrics"
    [each] = targets([with_decisions(single("tiny", 8000), host="::")])
    assert each.url == "http://[::1]:8000/metrics"
