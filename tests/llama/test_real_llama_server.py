"""The recipe's real llama-server (packaging/llama-runtime.sh, built for this CPU) serves the
tiny model's GGUF files, and what `check-model` reads from a file is what the engine itself
reports of it: its size, context, width, and the KV cache its attention figures give."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from epycd.model.check import inspect_model
from tests.health.realvllm import VllmServer, free_port
from tests.llama.realllama import llama_server, tiny_gguf

pytestmark = pytest.mark.llama
HEALTHY_WITHIN_S = 60.0
CONTEXT = 1024
KV_LOG = re.compile(r"llama_kv_cache: size = +(?P<mib>[0-9.]+) MiB \( *(?P<cells>\d+) cells")


@pytest.fixture(params=["q8_0", "bf16"])
def served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, str, VllmServer]]:
    model = tiny_gguf(request.param)
    port = free_port()
    argv = [
        str(llama_server()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-a", "tiny", "-t", "1", "-c", str(CONTEXT), "-np", "1", "--no-ui",
        "-lv", "4",  # the library's own lines: the KV cache it allocated
    ]  # fmt: skip
    server = VllmServer(argv, tmp_path, env={"PATH": "/usr/bin:/bin"})
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(base, HEALTHY_WITHIN_S, poll_s=0.2)
        yield model, base, server
    finally:
        server.stop()


def test_it_serves_chat_and_completions(served: tuple[Path, str, VllmServer]) -> None:
    _, base, _ = served
    models = httpx.get(f"{base}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] > 0
    completion = httpx.post(
        f"{base}/v1/completions",
        json={"model": "tiny", "prompt": "def main", "max_tokens": 8},
        timeout=60,
    )
    assert completion.status_code == 200, completion.text


def test_check_model_reads_what_the_engine_loads(served: tuple[Path, str, VllmServer]) -> None:
    model, base, server = served
    facts = inspect_model(str(model))
    assert facts.gguf is not None
    meta = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["meta"]
    assert meta["size"] == facts.weights_bytes == facts.gguf.tensors_bytes
    assert meta["n_ctx_train"] == facts.max_position_embeddings
    assert meta["n_embd"] == facts.gguf.embedding_length
    kv = KV_LOG.search(server.log_text())
    assert kv is not None, server.log_text()[-3000:]
    cells = int(kv["cells"])
    assert cells == CONTEXT
    assert float(kv["mib"]) == pytest.approx(cells * facts.kv_bytes_per_token / 1024**2, abs=0.005)
