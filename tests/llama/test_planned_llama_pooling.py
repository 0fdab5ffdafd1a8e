"""A planned llama.cpp embedding endpoint, served for real: `epycctl plan` of the tiny GGUF
declared an embedder (pooling type last, as Qwen3-Embedding's GGUF is) with this machine's
llama-server, then its unit's ExecStart= run as systemd would (the supervisor with the plan's
gate and width, the plan's `llama-server` words, a test-made NOTIFY_SOCKET): READY=1 once the
gate's embeddings request passed; the hand-off's curl and Python answered by it; an input
longer than the model's context refused by llama-server with its own error while the
endpoint serves on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from epycd.status.handoff import base_url, openai_example, ready_curl
from tests.health.notifysock import NotifySocket
from tests.health.pooling_models import tiny_width
from tests.health.realvllm import free_port
from tests.health.supervising import exec_start, start_supervisor
from tests.llama.realllama import llama_server, tiny_gguf, with_pooling
from tests.machine import serving
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_cli_plan import run

LOAD_BOUND_S = 120


def test_a_planned_llama_embedder_gets_ready_and_answers_its_handoff(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    (tmp_path / "ws").mkdir()
    ws = PlanWorkspace(tmp_path / "ws")
    model = with_pooling(tiny_gguf("q8_0"), tmp_path / "tiny-embedder.gguf", "last")
    port = free_port()
    ws.endpoint("emb", f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\n'
                f'model = "{model}"\nport = {port}\nmax_model_len = 256\n')  # fmt: skip
    planned = run(ws, "emb", "--json", "--root", str(serving(tmp_path).root))
    assert planned.exit_code == 0, planned.output
    data = json.loads(planned.output)
    assert data["primary_endpoint"] == "embeddings"
    argv = exec_start(data["units"]["epyc-llm-emb.service"])
    assert argv[argv.index("--endpoint") + 1] == "embeddings"
    assert argv[argv.index("--embedding-width") + 1] == str(tiny_width())
    assert "--embeddings" in argv and argv[argv.index("--ubatch-size") + 1] == "256"
    served, url = data["served_model_name"], base_url(port)

    log = tmp_path / "supervisor.log"
    with NotifySocket(tmp_path / "notify") as sock:
        reap.append(start_supervisor(argv, {"NOTIFY_SOCKET": str(sock.path)}, log))
        ready = sock.wait_for("READY=1", LOAD_BOUND_S)
        assert ready is not None, log.read_text()[-4000:]

        command = ready_curl(url, served, "embeddings")
        curl = subprocess.run(["bash", "-O", "failglob", "-c", command],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert curl.returncode == 0, curl.stderr
        vectors = [item["embedding"] for item in json.loads(curl.stdout)["data"]]
        assert [len(v) for v in vectors] == [tiny_width(), tiny_width()]
        python = subprocess.run([sys.executable, "-c", openai_example(url, served, "embeddings")],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert python.returncode == 0, python.stderr
        assert python.stdout.split() == ["2", str(tiny_width())]

        long_input = " ".join(["the quick brown fox jumps over the lazy dog"] * 100)
        refused = httpx.post(f"{url}/embeddings", json={"model": served, "input": long_input},
                             timeout=30)  # fmt: skip
        assert 400 <= refused.status_code < 500, refused.text
        again = httpx.post(f"{url}/embeddings", json={"model": served, "input": "hello"},
                           timeout=30)  # fmt: skip
        assert again.status_code == 200, "it serves on after the error"
