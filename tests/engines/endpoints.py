"""Endpoint files of each engine for the engine-wide tests: the same endpoint, one server or
a set of two, served by each registered engine with a local model of its format."""

from __future__ import annotations

from pathlib import Path

from epycd.engines import ENGINES as REGISTERED
from tests.plan.test_llama_plan import fake_llama_server, gguf_model

ENGINES = tuple(e.name for e in REGISTERED)
"""Every registered engine: the two built in, and the test-only toy engine in a process that
has tests/engines/plugins on its path (tests/engines/test_toy_engine.py)."""
SHAPES = ("one", "set")


def engine_lines(tmp: Path, engine: str) -> str:
    """The lines that make an endpoint file this engine's: a llama.cpp one names a GGUF file
    and a llama-server (fakes that answer --version); a vLLM one, and a toy one, take the
    workspace's model folder (tests/plan/conftest.py)."""
    if engine == "vllm":
        return ""
    if engine == "llama.cpp":
        server = fake_llama_server(tmp / "llama" / "bin")
        return f'engine = "llama.cpp"\nllama_server = "{server}"\nmodel = "{gguf_model(tmp)}"\n'
    if engine == "toy":
        return 'engine = "toy"\n'
    raise KeyError(f"{engine}: give its endpoint lines in tests/engines/endpoints.py")


def endpoint_text(tmp: Path, engine: str, shape: str) -> str:
    return engine_lines(tmp, engine) + ("instances = 2\n" if shape == "set" else "")
