"""A vLLM embedding and reranker endpoint in epycd's /metrics and in the live load
(docs/metrics.md): the real vLLM of this machine serving the tiny BERT embedder or reranker
on the pooling runner, its own families forwarded with the endpoint's labels through the real
promtool, each input (or document) a finished request, and its input tokens (vLLM's prompt
tokens; nothing is generated) read into the live load."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from epycd.host.facts import RuntimeFacts
from epycd.metrics.load import LoadWindow
from epycd.metrics.scrape import read_all, targets
from epycd.plan.endpoint import Plan
from epycd.status.handoff import request_body
from tests.health.pooling_models import SERVED, tiny_bert, vllm_serving
from tests.metrics.conftest import promtool
from tests.metrics.test_exposition import Serve, ready, samples, serve, value
from tests.plan.conftest import PODMAN_5, PlanWorkspace, fake_host

__all__ = ["serve"]

pytestmark = [pytest.mark.vllm, pytest.mark.serves]


def pooled_plan(tmp_path: Path, model: Path, port: int) -> Plan:
    ws = PlanWorkspace(tmp_path)
    ws.endpoint("pooled", f'model = "{model}"\nport = {port}\nserved_model_name = "{SERVED}"\n')
    result = ws.plan(fake_host(tmp_path, "vm-zen5-24g", RuntimeFacts(podman=PODMAN_5)))["pooled"]
    assert result.plan is not None, [e.text for e in result.errors]
    return result.plan


@pytest.mark.parametrize(("name", "endpoint"), [("embedder", "embeddings"), ("reranker", "rerank")])
def test_a_vllm_pooling_endpoints_families_and_input_tokens_reach_metrics_and_the_live_load(
    tmp_path: Path, serve: Serve, name: str, endpoint: str
) -> None:
    model = tiny_bert(name)
    (tmp_path / "work").mkdir()
    window = LoadWindow()
    with vllm_serving(model, ("--runner", "pooling"), tmp_path / "work") as (url, server):
        server.wait_healthy(url, 300)
        plan = pooled_plan(tmp_path, model, int(url.rsplit(":", 1)[1]))
        found = targets([plan])
        window.add(read_all(found), now=0.0)
        body = request_body(SERVED, endpoint)
        reply = httpx.post(f"{url}/v1/{endpoint}", json=body, timeout=60).json()
        window.add(read_all(found), now=10.0)
        text = httpx.get(serve([ready("pooled")], {"pooled": plan}), timeout=5).text
    assert plan.decisions.primary_endpoint == endpoint
    checked = subprocess.run(
        [str(promtool()), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    prompt = reply["usage"]["prompt_tokens"] if endpoint == "embeddings" else None
    answers = reply["data"] if endpoint == "embeddings" else reply["results"]
    assert len(answers) == 2, reply
    found_samples = samples(text)
    labels = {"endpoint": "pooled", "vllm_instance": "0", "socket": "0"}
    assert value(found_samples, "epyc_llm_instance_up", **labels) == 1
    # prometheus_client's parser reads vLLM's `vllm:` names with an underscore
    forwarded = value(found_samples, "vllm_prompt_tokens_total", **labels)
    assert forwarded > 0 and (prompt is None or forwarded == prompt)
    finished = value(found_samples, "vllm_request_success_total", finished_reason="stop", **labels)
    assert finished == 2, "vLLM counts each input, or each document, as a request"
    assert value(found_samples, "epyc_llm_plan_max_model_len", **labels) == 512
    [load] = window.loads("pooled")
    assert load.tokens_per_second == forwarded / 10
