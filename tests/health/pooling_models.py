"""Tiny pooling models for the real servers.

- the tiny chat model itself (tests/tools/tiny_model.py), which vLLM's pooling runner serves
  as an embedding model (`--runner pooling --convert embed`: last-token pooling, the hidden
  size wide);
- a tiny BERT embedder and a one-label BERT reranker, architectures vLLM's tables list,
  which plain `vllm serve` serves (its runner `auto` resolves to pooling): built by
  tests/tools/tiny_pooling.sh into the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

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
