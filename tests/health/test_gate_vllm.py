"""The health gate against a real vLLM on this CPU serving the tiny model.

One server (with an API key) serves every ready/models test of this module; the killed
during load case, first so that two servers never run at once, starts its own and kills it
long before it could answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epycd.health import GateConfig, GateResult, run_gate
from tests.health.realvllm import VllmServer, free_port, serve_argv, tiny_model

pytestmark = [pytest.mark.vllm, pytest.mark.serves]

API_KEY = "tiny-secret"
SERVED = "tiny"


@dataclass
class Served:
    url: str
    server: VllmServer
    first_gate: GateResult
    """the gate that waited through the model load"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("vllm-gate")
    port = free_port()
    server = VllmServer(serve_argv(tiny_model(), port, SERVED, "--api-key", API_KEY), work)
    url = f"http://127.0.0.1:{port}"
    try:
        first = run_gate(gate(url, api_key=API_KEY, load_timeout=300), server.alive)
        yield Served(url, server, first)
    finally:
        server.stop()


def gate(url: str, **overrides: Any) -> GateConfig:
    return GateConfig.model_validate({"url": url, "served_model_name": SERVED} | overrides)


def test_server_killed_during_load_fails_at_once(tmp_path: Path) -> None:
    port = free_port()
    running = VllmServer(serve_argv(tiny_model(), port, SERVED), tmp_path)
    killer = threading.Timer(4.0, running.process.kill)
    killer.start()
    started = time.monotonic()
    try:
        result = run_gate(gate(f"http://127.0.0.1:{port}", load_timeout=600), running.alive)
        elapsed = time.monotonic() - started
    finally:
        killer.cancel()
        running.stop()
    assert (result.ok, result.phase) == (False, "health")
    assert "server exited while loading" in result.reason
    assert "ConnectError" in result.reason, "it was still loading, not listening"
    assert elapsed < 4.0 + 2.0, f"took {elapsed:.1f} s: waited instead of failing"


def test_gate_waits_through_the_load_and_passes(served: Served) -> None:
    first = served.first_gate
    assert first.ok, f"{first.reason}\n{served.server.log_text()[-3000:]}"
    assert first.seconds["health"] > 5, "the model load was waited for, not skipped"
    assert first.seconds["request"] < 30


@pytest.mark.parametrize("endpoint", ["chat_completions", "completions"])
def test_ready_server_passes_on_each_endpoint(served: Served, endpoint: str) -> None:
    result = run_gate(
        gate(served.url, api_key=API_KEY, endpoint=endpoint, load_timeout=5), served.server.alive
    )
    assert result.ok, result.reason
    assert result.phase == "request"
    assert result.seconds["health"] < 2


def test_served_name_missing_fails_in_models(served: Served) -> None:
    result = run_gate(
        gate(served.url, api_key=API_KEY, served_model_name="Qwen/Qwen3-8B", load_timeout=5),
        served.server.alive,
    )
    assert (result.ok, result.phase) == (False, "models")
    assert "'Qwen/Qwen3-8B'" in result.reason and "lists tiny" in result.reason
    assert "request" not in result.seconds


def test_missing_api_key_fails_in_models_with_401(served: Served) -> None:
    result = run_gate(gate(served.url, load_timeout=5), served.server.alive)
    assert (result.ok, result.phase) == (False, "models")
    assert "401" in result.reason
