"""`epycctl bench NAME` of a llama.cpp endpoint through the real CLI: no vLLM there, so epycd's
own client (`epycd.servebench`) measures the approved endpoint, here a real llama-server of this
machine serving the tiny GGUF with an API key. The tokens counted are the server's own: its
/metrics counter of predicted tokens grows by exactly what the runs asked for (warm-ups
included); the key reaches the server and no output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.host.facts import RuntimeFacts
from epycd.render import render_for_plan
from tests.approval.conftest import ApprovalSandbox
from tests.llama.realllama import llama_server, published_gemma, serving, tiny_gguf
from tests.plan.conftest import PlanWorkspace, fake_host
from tests.secrets import root_folder, write_secret

KEY = "sk-bench-llama-secret"
OUTPUT_LEN = 6


def predicted_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:tokens_predicted_total"))
    return float(line.split()[-1])


@pytest.fixture
def served() -> Iterator[str]:
    with serving("-c", "1024", "-np", "2", key=KEY) as url:
        yield url


def approve_llama(
    env: ApprovalSandbox, folder: Path, port: int, model: Path | None = None, context: int = 1024
) -> None:
    """`tiny`, a llama.cpp endpoint of `model` (the tiny chat GGUF by default) on `port`,
    with an API key, approved and not started (the test serves it)."""
    key = write_secret(folder / "secrets" / "tiny.key", KEY + "\n")
    ws = PlanWorkspace(folder)
    ws.endpoint(
        "tiny",
        f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\n'
        f'model = "{model or tiny_gguf()}"\nport = {port}\napi_key_file = "{key}"\n'
        f"max_model_len = {context}\n",
    )
    host = fake_host(folder, "vm-zen5-24g", RuntimeFacts())
    result = ws.plan(host)["tiny"]
    assert result.plan is not None, [e.text for e in result.errors]
    decisions = result.plan.decisions
    assert isinstance(decisions.first, LlamaServer)
    units, dirs = render_for_plan(decisions, env.settings.unit_dir, env.settings.quadlet_dir)
    env.set_plans(result.plan.model_copy(update={"units": units, "unit_dirs": dirs}))
    done = env.epycctl("approve", "tiny", "--yes", "--no-start")
    assert done.returncode == 0, done.stderr


def test_bench_measures_a_llama_endpoint_by_the_servers_own_count(
    env: ApprovalSandbox, served: str
) -> None:
    url = served
    with root_folder() as folder:
        approve_llama(env, folder, int(url.rsplit(":", 1)[1]))
        before = predicted_tokens(url)
        done = env.epycctl(
            "bench", "tiny", "--concurrency", "1", "--concurrency", "2",
            "--input-len", "16", "--output-len", str(OUTPUT_LEN), "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    runs = data["runs"]
    assert [run["concurrency"] for run in runs] == [1, 2]
    assert [run["num_prompts"] for run in runs] == [8, 8]
    assert all(run["completed"] == 8 and run["error"] is None for run in runs), runs
    assert all(run["output_throughput"] > 0 and run["mean_ttft_ms"] > 0 for run in runs)
    assert all(run["mean_tpot_ms"] is not None for run in runs)
    warmups = 1 + 2
    assert predicted_tokens(url) - before == (8 + 8 + warmups) * OUTPUT_LEN
    assert "concurrency 2: done" in done.stderr
    assert KEY not in done.stdout + done.stderr
    kept = json.loads((env.settings.state_dir / "bench" / "tiny.json").read_text())
    assert kept["runs"] == runs


def test_offline_bench_of_a_llama_endpoint_is_refused_with_the_fix(
    env: ApprovalSandbox, served: str
) -> None:
    with root_folder() as folder:
        approve_llama(env, folder, int(served.rsplit(":", 1)[1]))
        done = env.epycctl("bench", "tiny", "--offline")
    assert done.returncode == 1
    assert "served by llama.cpp" in done.stderr and "without --offline" in done.stderr


def test_bench_measures_the_published_gemma(env: ApprovalSandbox) -> None:
    """The real Gemma 3 270M (an architecture the formulas do not cover, planned from
    llama-server's own pass) benched through `epycctl bench`: every request completes, with
    tokens out and a first-token time, counted by the server itself."""
    with serving("-c", "1024", "-np", "2", key=KEY, model=published_gemma()) as url:
        with root_folder() as folder:
            approve_llama(env, folder, int(url.rsplit(":", 1)[1]), published_gemma())
            before = predicted_tokens(url)
            done = env.epycctl(
                "bench", "tiny", "--concurrency", "1", "--concurrency", "2",
                "--input-len", "16", "--output-len", str(OUTPUT_LEN), "--json",
            )  # fmt: skip
        predicted = predicted_tokens(url) - before
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert all(run["completed"] == 8 and run["error"] is None for run in runs), runs
    assert all(run["output_throughput"] > 0 and run["mean_ttft_ms"] > 0 for run in runs)
    assert 0 < predicted <= (8 + 8 + 1 + 2) * OUTPUT_LEN  # a real model may stop at its end
