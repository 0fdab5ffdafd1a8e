"""A planned llama.cpp embedder and reranker of the BERT encoder, served for real: `epycctl
plan` of the tiny BERT pair as llama.cpp's converter writes them (the embedder with mean
pooling, the reranker with a one-output classifier head and no pooling type) with this
machine's llama-server, then its unit's ExecStart= run as systemd would (the supervisor with
the plan's gate, the plan's `llama-server` words, a test-made NOTIFY_SOCKET): READY=1 once the
gate's request passed on the endpoint's own path; the hand-off's curl and Python answered; the
server's compute buffer within the plan's (docs/tuning.md rule 9's encoder formula); an input
over the model's 512 positions refused with llama-server's own error (a 500 naming the input's
tokens) and a chat request with its own (a 500: no logits in this context), while the
endpoint serves on."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from epycd.status.handoff import base_url, ready_curl
from tests.health.notifysock import NotifySocket
from tests.health.pooling_models import handoff_answers
from tests.health.realvllm import free_port
from tests.health.supervising import exec_start, start_supervisor
from tests.llama.planned import planned_with_real_llama
from tests.llama.realllama import tiny_bert_gguf

LOAD_BOUND_S = 120
BUFFER = re.compile(r"CPU\s+(KV|compute|output) buffer size =\s+([\d.]+) MiB")
MIB = 1024**2
WIDTH = 128
"""The tiny BERT's hidden size (tests/tools/tiny_pooling.py)."""


def planned(tmp_path: Path, name: str) -> dict[str, Any]:
    return planned_with_real_llama(tmp_path, "bert", tiny_bert_gguf(name))


@pytest.mark.parametrize(
    ("name", "endpoint", "flag"),
    [("embedder", "embeddings", "--embeddings"), ("reranker", "rerank", "--rerank")],
)
def test_a_planned_bert_endpoint_gets_ready_and_answers_its_handoff(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]], name: str, endpoint: str, flag: str
) -> None:
    data = planned(tmp_path, name)
    assert data["primary_endpoint"] == endpoint
    argv = exec_start(data["units"]["epyc-llm-bert.service"])
    assert argv[argv.index("--endpoint") + 1] == endpoint
    assert flag in argv
    assert argv[argv.index("--ctx-size") + 1] == "512", "the model's own 512 positions"
    assert argv[argv.index("--ubatch-size") + 1] == "512", "an input is read in one step"
    memory = data["memory"]["memory"]
    # an encoder has no KV cache (its own log, below); llama.cpp's pass prints 0 MiB, held as 1
    assert memory["kv_bytes"] <= MIB, memory
    served, url = data["served_model_name"], base_url(int(argv[argv.index("--port") + 1]))

    log = tmp_path / "supervisor.log"
    with NotifySocket(tmp_path / "notify") as sock:
        reap.append(start_supervisor(argv, {"NOTIFY_SOCKET": str(sock.path)}, log))
        ready = sock.wait_for("READY=1", LOAD_BOUND_S)
        assert ready is not None, log.read_text()[-4000:]

        answer, width = handoff_answers(url, served, endpoint)
        if endpoint == "embeddings":
            assert width == WIDTH
            assert argv[argv.index("--embedding-width") + 1] == str(WIDTH), "the gate's width"

        over = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)
        body = (
            {"model": served, "input": over}
            if endpoint == "embeddings"
            else {"model": served, "query": over, "documents": ["a", "b"]}
        )
        refused = httpx.post(f"{url}/{endpoint}", json=body, timeout=30)
        # llama-server's own answer for an encoder, a 500 that names the input's size
        assert refused.status_code >= 400, refused.text
        assert "tokens) is too large" in refused.json()["error"]["message"], refused.text
        message = {"role": "user", "content": "hi"}
        chat = httpx.post(f"{url}/chat/completions", json={"model": served, "messages": [message]},
                          timeout=30)  # fmt: skip
        assert chat.status_code >= 400, chat.text  # llama-server's own: no logits here
        assert "does not support logits" in chat.json()["error"]["message"], chat.text
        again = subprocess.run(["bash", "-c", ready_curl(url, served, endpoint)],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert json.loads(again.stdout).keys() == answer.keys(), "it serves on after the errors"

    logged = logged_buffers(argv[argv.index("--") + 1 :])
    assert "KV" not in logged, logged
    # llama.cpp's own pass prints whole MiB rounded down; the plan raises each by 1 MiB
    assert memory["source"] == "llama.cpp"
    assert logged["compute"] * MIB <= memory["compute_bytes"] <= (logged["compute"] + 1) * MIB
    assert round(memory["output_bytes"] / MIB, 2) == logged["output"]


def logged_buffers(words: list[str]) -> dict[str, float]:
    """The buffers the plan's `llama-server` words allocate, as its own log at -lv 4 says
    (on another port), read until the compute buffer's line."""
    port = words.index("--port") + 1
    argv = [*words[:port], str(free_port()), *words[port + 1 :], "-lv", "4"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found: dict[str, float] = {}
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if match := BUFFER.search(line):
                found[match.group(1)] = float(match.group(2))
            if "compute" in found:
                break
    finally:
        process.kill()
        process.wait()
    return found
