"""The health gate of embeddings and rerank endpoints against real servers on this CPU:
vLLM's pooling runner serving the tiny model as an embedder, a tiny BERT cross-encoder on
plain `vllm serve`, and llama-server with `--embeddings` serving the tiny GGUF. The engines'
own answers to a request the endpoint does not serve pass through the gate as its reason.
The reranker runs first, before the embedder of the module's fixture starts: one vLLM at a
time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from epycd.health import GateConfig, GateResult, run_gate
from tests.health.pooling_models import (
    EMBEDDING_FLAGS,
    SERVED,
    tiny_bert,
    tiny_width,
    vllm_serving,
)
from tests.health.realvllm import tiny_model
from tests.llama.realllama import serving

LONG_INPUT = " ".join(["the quick brown fox jumps over the lazy dog"] * 200)
"""About 1,800 tokens: over the tiny model's 512 (as served) and llama-server's 64."""


def gate(url: str, **overrides: Any) -> GateConfig:
    return GateConfig.model_validate(
        {"url": url, "served_model_name": SERVED, "load_timeout": 300} | overrides
    )


@pytest.mark.vllm
@pytest.mark.serves
def test_vllm_rerank_of_a_bert_cross_encoder_passes_with_one_score_per_document(
    tmp_path: Path,
) -> None:
    """Plain `vllm serve` of a one-label BERT classifier: its runner resolves to pooling."""
    (tmp_path / "work").mkdir()
    with vllm_serving(tiny_bert("reranker"), (), tmp_path / "work") as (url, server):
        result = run_gate(gate(url, endpoint="rerank"), server.alive)
        assert result.ok, result.reason
        assert result.reason == f"{SERVED} answered on /v1/rerank"
        embeddings = run_gate(gate(url, endpoint="embeddings"))
        assert (embeddings.ok, embeddings.phase) == (False, "request"), "a reranker embeds not"


@pytest.fixture(scope="module")
def vllm_embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, GateResult]]:
    """The tiny model on vLLM's pooling runner, and the gate that waited through its load."""
    with vllm_serving(tiny_model(), EMBEDDING_FLAGS, tmp_path_factory.mktemp("emb")) as (
        url,
        server,
    ):
        config = gate(url, endpoint="embeddings", embedding_width=tiny_width())
        yield url, run_gate(config, server.alive)


@pytest.mark.vllm
@pytest.mark.serves
def test_vllm_embeddings_pass_with_vectors_of_the_models_width(
    vllm_embedder: tuple[str, GateResult],
) -> None:
    _, first = vllm_embedder
    assert first.ok, first.reason
    assert first.reason == f"{SERVED} answered on /v1/embeddings"


@pytest.mark.vllm
@pytest.mark.serves
def test_vllm_embeddings_of_another_width_fail_naming_the_one_served(
    vllm_embedder: tuple[str, GateResult],
) -> None:
    url, _ = vllm_embedder
    result = run_gate(gate(url, endpoint="embeddings", embedding_width=tiny_width() * 2))
    assert (result.ok, result.phase) == (False, "request")
    assert f"have {tiny_width()} numbers, not {tiny_width() * 2}" in result.reason


@pytest.mark.vllm
@pytest.mark.serves
def test_a_chat_request_to_vllms_embedder_fails_with_its_own_answer(
    vllm_embedder: tuple[str, GateResult],
) -> None:
    url, _ = vllm_embedder
    result = run_gate(gate(url, endpoint="chat_completions"))
    assert (result.ok, result.phase) == (False, "request")
    assert "/v1/chat/completions answered HTTP 404" in result.reason


@pytest.mark.vllm
@pytest.mark.serves
def test_an_input_over_vllms_sequence_limit_gets_its_error_and_it_serves_on(
    vllm_embedder: tuple[str, GateResult],
) -> None:
    url, _ = vllm_embedder
    answer = httpx.post(
        f"{url}/v1/embeddings", json={"model": SERVED, "input": LONG_INPUT}, timeout=60
    )
    assert answer.status_code == 400, answer.text
    assert "512" in answer.text, "vLLM names the model's limit"
    assert run_gate(gate(url, endpoint="embeddings", embedding_width=tiny_width())).ok


@pytest.mark.llama
def test_llama_server_embeddings_pass_and_an_input_over_its_context_gets_its_error() -> None:
    with serving("--embeddings", "--pooling", "last", "-c", "64", "-a", SERVED) as url:
        result = run_gate(gate(url, endpoint="embeddings", embedding_width=tiny_width()))
        assert result.ok, result.reason
        assert result.reason == f"{SERVED} answered on /v1/embeddings"
        answer = httpx.post(
            f"{url}/v1/embeddings", json={"model": SERVED, "input": LONG_INPUT}, timeout=60
        )
        assert answer.status_code >= 400 and "error" in answer.json(), answer.text
        assert run_gate(gate(url, endpoint="embeddings")).ok, "it serves on"
