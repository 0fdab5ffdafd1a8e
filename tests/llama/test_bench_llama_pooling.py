"""`epycctl bench NAME` of a llama.cpp embeddings and rerank endpoint through the real CLI:
the planner's endpoint for the tiny BERT GGUF, approved in the approval sandbox, in front of
a real llama-server serving that file. epycd's pooling client measures it; llama-server's own
/metrics counts the prompt tokens the runs and their warm-ups sent."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from epycd.render import render_for_plan
from tests.approval.conftest import make_env
from tests.llama.realllama import serving, tiny_bert_gguf
from tests.metrics.test_llama_metrics import llama_plan

PROMPT_COUNTER = "llamacpp:prompt_tokens_total"
FLAGS = {"embedder": ("--embeddings",), "reranker": ("--rerank",)}


def prompt_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return float(next(line for line in text.splitlines()
                      if line.startswith(PROMPT_COUNTER)).split()[-1])  # fmt: skip


@pytest.mark.parametrize("name", ["embedder", "reranker"])
def test_bench_measures_a_llama_pooling_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    env = make_env(tmp_path / "sandbox", monkeypatch)
    model = tiny_bert_gguf(name)
    with serving(*FLAGS[name], model=model) as url:
        (tmp_path / "plan").mkdir()
        plan = llama_plan(tmp_path / "plan", int(url.rsplit(":", 1)[1]), model, 512)
        assert plan.decisions.primary_endpoint == ("embeddings" if name == "embedder" else "rerank")
        units, dirs = render_for_plan(plan.decisions, env.settings.unit_dir,
                                      env.settings.quadlet_dir)  # fmt: skip
        env.set_plans(plan.model_copy(update={"units": units, "unit_dirs": dirs}))
        approved = env.epycctl("approve", "tiny", "--yes", "--no-start", "--no-pull")
        assert approved.returncode == 0, approved.stderr
        before = prompt_tokens(url)
        done = env.epycctl("bench", "tiny", "--concurrency", "1", "--concurrency", "2",
                           "--input-len", "32", "--json")  # fmt: skip
        after = prompt_tokens(url)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [run["concurrency"] for run in runs] == [1, 2]
    assert all(run["completed"] == 8 and run["error"] is None for run in runs), runs
    for run in runs:
        assert run["request_throughput"] == pytest.approx(8 / run["duration"])
        assert 0 < run["p50_latency_ms"] <= run["duration"] * 1000
        assert run["output_throughput"] is None
    counted = sum(run["input_throughput"] * run["duration"] for run in runs)
    # the server saw the runs' input tokens and the warm-ups' (1 + 2 requests) on top; a
    # warm-up's random input is as long as a measured one's within their spread (5 %): on a
    # Zen 5 VM the three came to 392.7 tokens each against 389.7 for the 16 measured ones
    warm_ups = counted / 16 * 3 * 1.05
    assert counted <= after - before <= counted + warm_ups + 1, (counted, after - before)
