"""A planned embedding and reranker endpoint, served for real: `epycctl plan` of the tiny BERT
embedder and one-label reranker, and of a tiny Qwen3ForCausalLM that a sentence-transformers
pooling module makes an embedder (as Qwen3-Embedding), with the real vLLM venv on this
machine, then its unit's ExecStart= run as systemd would (the supervisor with the plan's
gate, the plan's `vllm serve` words and environment, a test-made NOTIFY_SOCKET): READY=1
once the gate's request passed on the endpoint's own path, then the hand-off's curl and
Python example answered by it, and a chat request passed through with vLLM's own error while
the endpoint serves on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from epycd.status.handoff import base_url, ready_curl
from tests.health.notifysock import NotifySocket
from tests.health.pooling_models import handoff_answers, tiny_bert
from tests.health.realvllm import free_port, vllm_env, vllm_executable
from tests.health.supervising import exec_start, start_supervisor
from tests.machine import serving
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_cli_plan import run

pytestmark = [pytest.mark.vllm, pytest.mark.serves]

LOAD_BOUND_S = 300


@pytest.mark.parametrize(
    ("name", "endpoint"),
    [("embedder", "embeddings"), ("reranker", "rerank"), ("qwen3-embedder", "embeddings")],
)
def test_a_planned_pooling_endpoint_gets_ready_and_answers_its_handoff(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]], name: str, endpoint: str
) -> None:
    (tmp_path / "ws").mkdir()
    ws = PlanWorkspace(tmp_path / "ws")
    port = free_port()
    ws.endpoint("pooled", f'model = "{tiny_bert(name)}"\nvllm = "{vllm_executable()}"\n'
                f'runtime = "host"\nport = {port}\n')  # fmt: skip
    planned = run(ws, "pooled", "--json", "--root", str(serving(tmp_path).root))
    assert planned.exit_code == 0, planned.output
    data = json.loads(planned.output)
    assert data["primary_endpoint"] == endpoint
    argv = exec_start(data["units"]["epyc-llm-pooled.service"])
    assert argv[argv.index("--endpoint") + 1] == endpoint
    assert "--runner" in argv and argv[argv.index("--runner") + 1] == "pooling"
    served, url = data["served_model_name"], base_url(port)

    log = tmp_path / "supervisor.log"
    with NotifySocket(tmp_path / "notify") as sock:
        env = vllm_env(tmp_path / "work") | data["env"] | {"NOTIFY_SOCKET": str(sock.path)}
        reap.append(start_supervisor(argv, env, log))
        ready = sock.wait_for("READY=1", LOAD_BOUND_S)
        assert ready is not None, log.read_text()[-4000:]

        answer, width = handoff_answers(url, served, endpoint)
        if width is not None:
            assert argv[argv.index("--embedding-width") + 1] == str(width), "the gate's width"

        message = {"role": "user", "content": "hi"}
        chat = httpx.post(f"{url}/chat/completions", json={"model": served, "messages": [message]},
                          timeout=30)  # fmt: skip
        assert chat.status_code >= 400, "a pooling endpoint generates no chat"
        assert chat.status_code < 500, chat.text
        again = subprocess.run(["bash", "-c", ready_curl(url, served, endpoint)],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert json.loads(again.stdout).keys() == answer.keys(), "it serves on after the error"
