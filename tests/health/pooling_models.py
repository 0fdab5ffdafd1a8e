"""Pooling models for the real servers: tiny ones, and one published embedder.

- the tiny chat model itself (tests/tools/tiny_model.py), which vLLM's pooling runner serves
  as an embedding model (`--runner pooling --convert embed`: last-token pooling, the hidden
  size wide);
- a tiny BERT embedder and a one-label BERT reranker, architectures vLLM's tables list,
  which plain `vllm serve` serves (its runner `auto` resolves to pooling): built by
  tests/tools/tiny_pooling.sh into the cache;
- sentence-transformers/all-MiniLM-L6-v2, a published embedder with its real weights and
  tokenizer (tests/tools/published_embedder.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from epycd.status.handoff import openai_example, ready_curl
from tests.health.realvllm import CACHE, VllmServer, free_port, serve_argv, tiny_model_builder

EMBEDDING_FLAGS = ("--runner", "pooling", "--convert", "embed")
TINY_POOLING = CACHE / "tiny-pooling"
SERVED = "tiny"


def tiny_bert(name: str) -> Path:
    """The cached tiny BERT `embedder` or `reranker`; the test FAILS (never skips) without it."""
    folder = TINY_POOLING / name
    if not (folder / "config.json").is_file() or not (TINY_POOLING / ".stamp").is_file():
        pytest.fail(f"no {folder}: run tests/bootstrap.sh (tests/tools/tiny_pooling.sh)")
    return folder


PUBLISHED_EMBEDDER = CACHE / "published-embedder" / "all-MiniLM-L6-v2"


def published_embedder() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2's published files (tests/tools/
    published_embedder.sh); the test FAILS (never skips) without them."""
    if not (PUBLISHED_EMBEDDER / "model.safetensors").is_file():
        pytest.fail(f"no {PUBLISHED_EMBEDDER}: run tests/bootstrap.sh (published_embedder.sh)")
    return PUBLISHED_EMBEDDER


def tiny_width() -> int:
    """The tiny model's hidden size: its embeddings' width."""
    return int(tiny_model_builder().TINY.hidden)


@contextmanager
def vllm_serving(
    model: Path, flags: tuple[str, ...], work: Path
) -> Iterator[tuple[str, VllmServer]]:
    """A real `vllm serve` of `model` with `flags`: its base URL (not yet ready) and itself."""
    port = free_port()
    server = VllmServer(serve_argv(model, port, SERVED, *flags), work)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.stop()


def handoff_answers(url: str, served: str, endpoint: str) -> tuple[dict[str, Any], int | None]:
    """The hand-off's curl and Python example, run against a pooling endpoint: the curl's
    answer, and the width of its vectors (None for rerank). Asserts that both answered whole:
    two vectors of one width, or a score for each of the two documents."""
    curl = subprocess.run(["bash", "-O", "failglob", "-c", ready_curl(url, served, endpoint)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert curl.returncode == 0, curl.stderr
    answer: dict[str, Any] = json.loads(curl.stdout)
    python = subprocess.run([sys.executable, "-c", openai_example(url, served, endpoint)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert python.returncode == 0, python.stderr
    if endpoint == "rerank":
        assert sorted(r["index"] for r in answer["results"]) == [0, 1], answer
        scored = sorted(line.split()[0] for line in python.stdout.splitlines())
        assert scored == ["0", "1"], python.stdout
        return answer, None
    widths = {len(item["embedding"]) for item in answer["data"]}
    assert len(answer["data"]) == 2 and len(widths) == 1, answer
    width = widths.pop()
    assert python.stdout.split() == ["2", str(width)]
    return answer, width
