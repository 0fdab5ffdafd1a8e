"""The real llama-server and the tiny GGUF files the llama.cpp tests serve
(tests/tools/llama_server.sh: the product's recipe, packaging/llama-runtime.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.realvllm import CACHE

SERVER = CACHE / "llama-server"
TINY_GGUF = CACHE / "tiny-gguf"
BOOTSTRAP_HINT = "run tests/bootstrap.sh (it builds llama-server via tests/tools/llama_server.sh)"


def llama_server() -> Path:
    """The recipe's `llama-server`; the test FAILS (never skips) when it has not been built."""
    server = SERVER / "bin" / "llama-server"
    if not server.is_file() or not (SERVER / ".epyc-stamp").is_file():
        pytest.fail(f"no llama-server in {SERVER}: {BOOTSTRAP_HINT}")
    return server


def tiny_gguf(out_type: str = "q8_0") -> Path:
    path = TINY_GGUF / f"tiny-{out_type}.gguf"
    if not path.is_file():
        pytest.fail(f"no {path}: {BOOTSTRAP_HINT}")
    return path
