"""The KV pool the plan asks for is the one the real vLLM allocates (docs/tuning.md rule 7): the
plan's `memory.kv_pool_gb` against vLLM's own "KV cache size: N tokens" line at start, times the
model's KV bytes per token (vLLM's tokens come from its own page size, so a wrong per-token
figure fails here too). The same planned vLLM lists the endpoint file's aliases as its
models."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from epycd.model.check import inspect_model
from epycd.sizes import GIB
from tests.health.realvllm import VllmServer, free_port, tiny_model, vllm_env, vllm_executable
from tests.machine import serving
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_cli_plan import run

pytestmark = [pytest.mark.vllm, pytest.mark.serves]

KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")
START_BOUND_S = 600
ALIAS = "tiny-alias"


def logged_kv_tokens(server: VllmServer) -> int:
    """The tokens of vLLM's KV cache size line, once it has logged it."""
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        found = KV_LINE.search(server.log_text())
        if found:
            return int(found.group(1).replace(",", ""))
        assert server.alive(), server.log_text()[-4000:]
        time.sleep(1)
    raise AssertionError(f"no KV cache size line in {START_BOUND_S} s: {server.log_text()[-4000:]}")


def test_the_planned_kv_pool_is_the_one_vllm_allocates(
    ws: PlanWorkspace, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    vllm, model = vllm_executable(), tiny_model()
    expected = serving(tmp_path)
    # a free port of its own: the machine tests' endpoints listen beside it on this host
    port = free_port()
    ws.endpoint("tiny", f'model = "{model}"\nvllm = "{vllm}"\nruntime = "host"\n'
                f'max_model_len = 512\nport = {port}\naliases = ["{ALIAS}"]\n')  # fmt: skip
    result = run(ws, "tiny", "--json", "--root", str(expected.root))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    memory = data["memory"]
    assert memory["kv_pool_gb"] >= 1 and memory["process_gb"] > memory["kv_pool_gb"]
    work = tmp_path_factory.mktemp("kv")
    env = {k: v for k, v in vllm_env(work).items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    server = VllmServer([str(vllm), "serve", *data["vllm_args"]], work, env | data["env"])
    try:
        tokens = logged_kv_tokens(server)
        base = f"http://127.0.0.1:{port}"
        server.wait_healthy(base, START_BOUND_S)
        # no request: under an EPYC identity on another CPU, the plan's backend may not run
        # one (an Intel VM's zentorch worker died of SIGILL on the first step)
        listed = httpx.get(f"{base}/v1/models", timeout=30).json()
    finally:
        server.stop()
    assert [m["id"] for m in listed["data"]] == [data["served_model_name"], ALIAS]
    allocated = tokens * inspect_model(str(model)).kv_bytes_per_token
    planned = memory["kv_pool_gb"] * GIB
    assert abs(allocated - planned) <= 0.01 * planned, (tokens, allocated, planned)
