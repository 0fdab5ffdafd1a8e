"""A llama.cpp endpoint in epycd's /metrics and in the live load (docs/metrics.md): the real
llama-server's own families forwarded with the endpoint's labels through the real promtool,
the plan's sizing and instance count as for a vLLM instance, and its requests and token
counters read into `epycctl status NAME`'s load (it exports no KV cache usage)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.host.facts import RuntimeFacts
from epycd.metrics.load import LoadWindow
from epycd.metrics.scrape import read_all, targets
from epycd.plan.endpoint import Plan
from epycd.status.handoff import request_body
from tests.llama.realllama import llama_server, serving, tiny_bert_gguf, tiny_gguf
from tests.metrics.conftest import promtool
from tests.metrics.test_exposition import Serve, ready, samples, serve, value
from tests.plan.conftest import PlanWorkspace, fake_host

__all__ = ["serve"]


def llama_plan(
    tmp_path: Path, port: int, model: Path | None = None, max_model_len: int = 1024
) -> Plan:
    ws = PlanWorkspace(tmp_path)
    ws.endpoint(
        "tiny",
        f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\n'
        f'model = "{model or tiny_gguf()}"\nport = {port}\nmax_model_len = {max_model_len}\n',
    )
    result = ws.plan(fake_host(tmp_path, "vm-zen5-24g", RuntimeFacts()))["tiny"]
    assert result.plan is not None, [e.text for e in result.errors]
    assert isinstance(result.plan.decisions.first, LlamaServer)
    return result.plan


def chat(url: str) -> dict[str, int]:
    reply = httpx.post(
        f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 5}, timeout=60
    ).json()
    return dict(reply["usage"])


def test_llama_servers_families_are_forwarded_with_the_endpoints_labels(
    tmp_path: Path, serve: Serve
) -> None:
    with serving("-c", "1024") as url:
        plan = llama_plan(tmp_path, int(url.rsplit(":", 1)[1]))
        usage = chat(url)
        text = httpx.get(serve([ready("tiny")], {"tiny": plan}), timeout=5).text
    checked = subprocess.run(
        [str(promtool()), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = samples(text)
    labels = {"endpoint": "tiny", "vllm_instance": "0", "socket": "0", "numa_node": "0"}
    assert value(found, "epyc_llm_endpoint_instances", endpoint="tiny") == 1
    assert value(found, "epyc_llm_instance_up", **labels) == 1
    predicted = value(found, "llamacpp_tokens_predicted_total", **labels)
    assert predicted == usage["completion_tokens"] == 5
    assert value(found, "llamacpp_prompt_tokens_total", **labels) == usage["prompt_tokens"]
    decisions = plan.decisions.first
    assert isinstance(decisions, LlamaServer)
    assert value(found, "epyc_llm_plan_max_num_seqs", **labels) == decisions.invocation.slots
    assert value(found, "epyc_llm_plan_max_model_len", **labels) == 1024
    assert not [name for name, _ in found if name.startswith("llamacpp_n_tokens_max")], (
        "a counter without _total is left out"
    )


def test_the_live_load_reads_llama_servers_counters(tmp_path: Path) -> None:
    window = LoadWindow()
    with serving("-c", "1024") as url:
        plan = llama_plan(tmp_path, int(url.rsplit(":", 1)[1]))
        found = targets([plan])
        window.add(read_all(found), now=0.0)
        usage = chat(url)
        window.add(read_all(found), now=10.0)
    [load] = window.loads("tiny")
    assert load.running == 0 and load.waiting == 0 and load.kv_cache_usage is None
    assert load.window_seconds == 10.0
    assert load.tokens_per_second == (usage["prompt_tokens"] + usage["completion_tokens"]) / 10


@pytest.mark.parametrize(
    ("name", "endpoint", "flag"),
    [("embedder", "embeddings", "--embeddings"), ("reranker", "rerank", "--rerank")],
)
def test_a_llama_pooling_endpoints_input_tokens_reach_metrics_and_the_live_load(
    tmp_path: Path, serve: Serve, name: str, endpoint: str, flag: str
) -> None:
    """A BERT embedder or reranker on llama.cpp: its input tokens are llama-server's prompt
    tokens, in /metrics with the endpoint's labels and in the live load; nothing is
    predicted."""
    window = LoadWindow()
    model = tiny_bert_gguf(name)
    with serving(flag, "-c", "512", "-ub", "512", "-b", "512", model=model) as url:
        plan = llama_plan(tmp_path, int(url.rsplit(":", 1)[1]), model, max_model_len=512)
        found = targets([plan])
        window.add(read_all(found), now=0.0)
        body = request_body("tiny", endpoint)
        reply = httpx.post(f"{url}/v1/{endpoint}", json=body, timeout=60).json()
        window.add(read_all(found), now=10.0)
        text = httpx.get(serve([ready("tiny")], {"tiny": plan}), timeout=5).text
    assert plan.decisions.primary_endpoint == endpoint
    prompt = reply["usage"]["prompt_tokens"]
    answers = reply["data"] if endpoint == "embeddings" else reply["results"]
    assert prompt > 0 and len(answers) == 2, reply
    found_samples = samples(text)
    labels = {"endpoint": "tiny", "vllm_instance": "0", "socket": "0", "numa_node": "0"}
    assert value(found_samples, "epyc_llm_instance_up", **labels) == 1
    assert value(found_samples, "llamacpp_prompt_tokens_total", **labels) == prompt
    assert value(found_samples, "llamacpp_tokens_predicted_total", **labels) == 0
    assert value(found_samples, "epyc_llm_plan_max_model_len", **labels) == 512
    [load] = window.loads("tiny")
    assert load.tokens_per_second == prompt / 10
