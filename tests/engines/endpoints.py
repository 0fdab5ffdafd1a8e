"""Endpoint files of each engine for the engine-wide tests: the same endpoint, one server or
a set of two, served by each registered engine with a local model of its format."""

from __future__ import annotations

from pathlib import Path

from tests.plan.test_llama_plan import fake_llama_server, gguf_model

ENGINES = ("vllm", "llama.cpp")
"""Every engine of epycd.engines.ENGINES; tests/engines/test_server_facts.py checks the two
lists agree."""
SHAPES = ("one", "set")


def engine_lines(tmp: Path, engine: str) -> str:
    """The lines that make an endpoint file this engine's: a llama.cpp one names a GGUF file
    and a llama-server (fakes that answer --version); a vLLM one takes the workspace's model
    folder (tests/plan/conftest.py)."""
    if engine == "vllm":
        return ""
    server = fake_llama_server(tmp / "llama" / "bin")
    return f'engine = "llama.cpp"\nllama_server = "{server}"\nmodel = "{gguf_model(tmp)}"\n'


def endpoint_text(tmp: Path, engine: str, shape: str) -> str:
    return engine_lines(tmp, engine) + ("instances = 2\n" if shape == "set" else "")
