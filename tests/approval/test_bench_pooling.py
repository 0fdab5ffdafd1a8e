"""`epycctl bench NAME` of an embeddings and a rerank endpoint through the real CLI: epycd's
pooling client (`epycd.servebench.measure_pooling`) measures the approved endpoint, here a
real vLLM of this machine serving the tiny BERT embedder or reranker on the pooling runner.
The requests counted are the server's own (vLLM's /metrics counter of finished requests grows
by the runs and their warm-ups, each rerank document a request of its own); `--offline` is
refused with the fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from epycd.host.facts import RuntimeFacts
from epycd.render import render_for_plan
from epycd.servebench import RERANK_DOCUMENTS
from tests.approval.conftest import ApprovalSandbox
from tests.health.pooling_models import SERVED, tiny_bert, vllm_serving
from tests.plan.conftest import PODMAN_5, PlanWorkspace, fake_host

pytestmark = [pytest.mark.vllm, pytest.mark.serves]

SUCCESS_COUNTER = "vllm:request_success_total"


def finished_requests(url: str) -> float:
    """vLLM's own count of requests it finished, over every finish reason."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(SUCCESS_COUNTER + "{"))  # fmt: skip


def approve_pooled(env: ApprovalSandbox, folder: Path, model: Path, port: int) -> None:
    folder.mkdir()
    ws = PlanWorkspace(folder)
    ws.endpoint("pooled", f'model = "{model}"\nport = {port}\nserved_model_name = "{SERVED}"\n')
    result = ws.plan(fake_host(folder, "vm-zen5-24g", RuntimeFacts(podman=PODMAN_5)))["pooled"]
    assert result.plan is not None, [e.text for e in result.errors]
    units, dirs = render_for_plan(result.plan.decisions, env.settings.unit_dir,
                                  env.settings.quadlet_dir)  # fmt: skip
    env.set_plans(result.plan.model_copy(update={"units": units, "unit_dirs": dirs}))
    done = env.epycctl("approve", "pooled", "--yes", "--no-start", "--no-pull")
    assert done.returncode == 0, done.stderr


@pytest.fixture(params=["embedder", "reranker"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    model = tiny_bert(request.param)
    (tmp_path / "work").mkdir()
    with vllm_serving(model, ("--runner", "pooling"), tmp_path / "work") as (url, server):
        server.wait_healthy(url, 300)
        yield model, url


def test_bench_measures_a_pooling_endpoint_by_the_servers_own_count(
    env: ApprovalSandbox, served: tuple[Path, str], tmp_path: Path
) -> None:
    model, url = served
    approve_pooled(env, tmp_path / "plan", model, int(url.rsplit(":", 1)[1]))
    before = finished_requests(url)
    done = env.epycctl("bench", "pooled", "--concurrency", "1", "--concurrency", "2",
                       "--input-len", "32", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [run["concurrency"] for run in runs] == [1, 2]
    assert all(run["completed"] == 8 and run["error"] is None for run in runs), runs
    for run in runs:
        assert run["request_throughput"] == pytest.approx(8 / run["duration"])
        assert run["input_throughput"] > 8 * 32 / run["duration"] * 0.5, "about 32 tokens each"
        assert 0 < run["p50_latency_ms"] <= run["duration"] * 1000
        assert run["output_throughput"] is None and run["mean_ttft_ms"] is None
    warmups = 1 + 2
    each = RERANK_DOCUMENTS if "rerank" in str(model) else 1  # vLLM scores each document
    assert finished_requests(url) - before == (8 + 8 + warmups) * each

    shown = env.epycctl("bench", "pooled", "--concurrency", "1", "--input-len", "8")
    assert shown.returncode == 0, shown.stderr
    assert "Requests/s" in shown.stdout and "Input tok/s" in shown.stdout

    offline = env.epycctl("bench", "pooled", "--offline")
    assert offline.returncode != 0
    assert "measures generated tokens" in offline.stderr
    assert "epycctl bench pooled (without --offline)" in offline.stderr
