"""No network: right answers from the cache, or a clear error within seconds, never a hang."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epycd.errors import Refusal
from epycd.model.check import inspect_model
from epycd.model.facts import ModelFacts
from tests.sandbox import run_python

BOUND_S = 5.0


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a hub that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield int(server.getsockname()[1])


@pytest.fixture
def online_unreachable(
    offline_hub: Path, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> Path:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    return offline_hub


def timed(call: Callable[[], ModelFacts]) -> tuple[ModelFacts | Refusal, float]:
    start = time.monotonic()
    try:
        return call(), time.monotonic() - start
    except Refusal as exc:
        return exc, time.monotonic() - start


@pytest.mark.usefixtures("offline_hub")
def test_offline_model_not_in_cache_is_a_clear_refusal() -> None:
    error, seconds = timed(lambda: inspect_model("Qwen/Qwen3-235B-A22B"))
    assert isinstance(error, Refusal)
    assert "not in the local cache" in str(error) and "HF_HUB_OFFLINE" in str(error)
    assert "hf download Qwen/Qwen3-235B-A22B" in str(error)
    assert seconds < BOUND_S


@pytest.mark.usefixtures("online_unreachable")
def test_unreachable_hub_answers_from_the_cache_with_a_warning() -> None:
    facts, seconds = timed(lambda: inspect_model("Qwen/Qwen3-0.6B"))
    assert seconds < BOUND_S
    assert isinstance(facts, ModelFacts), facts
    assert facts.kv_bytes_per_token == 114688
    assert any("could not be reached" in w for w in facts.warnings)


@pytest.mark.usefixtures("online_unreachable")
def test_unreachable_hub_and_not_cached_is_a_clear_refusal() -> None:
    error, seconds = timed(lambda: inspect_model("Qwen/Qwen3-235B-A22B"))
    assert isinstance(error, Refusal)
    assert "the hub is unreachable" in str(error)
    assert seconds < BOUND_S


def test_a_silent_hub_is_bounded_by_the_timeout(
    offline_hub: Path, monkeypatch: pytest.MonkeyPatch, silent_port: int
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent_port}")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
    facts, seconds = timed(lambda: inspect_model("Qwen/Qwen3-0.6B"))
    assert seconds < BOUND_S
    assert isinstance(facts, ModelFacts), facts
    assert any("Timeout" in w for w in facts.warnings)


def test_epycctl_in_a_fresh_process_with_no_hub(offline_hub: Path, closed_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env |= {"HF_HOME": str(offline_hub), "HF_ENDPOINT": f"http://127.0.0.1:{closed_port}"}
    start = time.monotonic()
    ok = run_python(["-m", "epycd", "check-model", "Qwen/Qwen3-0.6B", "--json"], env=env)
    missing = run_python(["-m", "epycd", "check-model", "Qwen/Qwen3-235B-A22B"], env=env)
    assert time.monotonic() - start < 2 * BOUND_S + 10  # two interpreter starts included
    assert ok.returncode == 0, ok.stderr
    assert '"kind": "text"' in ok.stdout
    assert missing.returncode == 1
    assert "not in the local cache" in missing.stderr
    assert "Traceback" not in missing.stderr
