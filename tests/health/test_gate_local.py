"""The gate's decisions against a small local HTTP server (no vLLM needed)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from epycd.health import SMOKE_TEXTS, GateConfig, answer_text, run_gate, smoke_request
from tests.health.localhttp import embeddings_reply, local_server, openai_replies, rerank_reply
from tests.health.realvllm import free_port

LOADING = {"message": "Loading model", "type": "unavailable_error", "code": 503}
"""llama-server's /health error while it loads the model (tests/llama serves the real one)."""


def config(url: str, **overrides: Any) -> GateConfig:
    return GateConfig.model_validate(
        {"url": url, "served_model_name": "tiny", "poll_interval": 0.05} | overrides
    )


@pytest.mark.parametrize("endpoint", ["chat_completions", "completions"])
def test_healthy_server_passes_all_three_phases(endpoint: str) -> None:
    with local_server(openai_replies()) as (url, routes):
        result = run_gate(config(url, endpoint=endpoint))
    assert result.ok, result.reason
    assert list(result.seconds) == ["health", "models", "request"]
    method, path, _, body = routes.seen[-1]
    assert (method, path) == ("POST", smoke_request(config(url, endpoint=endpoint))[0])
    assert body["temperature"] == 0 and body["max_tokens"] == 16 and body["model"] == "tiny"
    assert ("messages" in body) == (endpoint == "chat_completions")
    assert ("prompt" in body) == (endpoint == "completions")


def test_http_200_with_error_payload_fails_in_request() -> None:
    replies = openai_replies()
    replies["/v1/chat/completions"] = (
        200,
        {"object": "error", "message": "model crashed", "type": "InternalError", "code": 500},
    )
    with local_server(replies) as (url, _):
        result = run_gate(config(url))
    assert not result.ok
    assert result.phase == "request"
    assert "model crashed" in result.reason


def test_200_with_error_object_inside_fails() -> None:
    replies = openai_replies()
    replies["/v1/completions"] = (200, {"error": {"message": "out of memory"}})
    with local_server(replies) as (url, _):
        result = run_gate(config(url, endpoint="completions"))
    assert (result.ok, result.phase) == (False, "request")
    assert "out of memory" in result.reason


def test_choice_without_text_fails() -> None:
    replies = openai_replies()
    replies["/v1/chat/completions"] = (200, {"choices": [{"index": 0, "message": {}}]})
    with local_server(replies) as (url, _):
        result = run_gate(config(url))
    assert (result.ok, result.phase) == (False, "request")
    assert "message.content" in result.reason


def test_request_error_status_fails_with_body() -> None:
    replies = openai_replies()
    replies["/v1/chat/completions"] = (400, {"message": "no chat template"})
    with local_server(replies) as (url, _):
        result = run_gate(config(url))
    assert (result.ok, result.phase) == (False, "request")
    assert "400" in result.reason and "no chat template" in result.reason


def test_connection_refused_is_waited_for_until_the_port_opens() -> None:
    port = free_port()
    opened = threading.Event()
    holder: dict[str, Any] = {}

    def open_later() -> None:
        time.sleep(1.0)
        holder["server"] = local_server(openai_replies(), port=port)
        holder["server"].__enter__()
        opened.set()

    opener = threading.Thread(target=open_later)
    opener.start()
    try:
        result = run_gate(config(f"http://127.0.0.1:{port}", load_timeout=30))
    finally:
        opener.join()
        holder["server"].__exit__(None, None, None)
    assert result.ok, result.reason
    assert result.seconds["health"] >= 0.9


def test_nothing_listening_fails_after_the_load_timeout() -> None:
    started = time.monotonic()
    result = run_gate(config(f"http://127.0.0.1:{free_port()}", load_timeout=0.5))
    assert (result.ok, result.phase) == (False, "health")
    assert "did not answer within 0.5 s" in result.reason
    assert "ConnectError" in result.reason
    assert 0.5 <= time.monotonic() - started < 5


def test_server_exit_while_waiting_fails_at_once_not_at_the_timeout() -> None:
    alive = threading.Event()
    alive.set()
    threading.Timer(0.3, alive.clear).start()
    started = time.monotonic()
    result = run_gate(config(f"http://127.0.0.1:{free_port()}", load_timeout=600), alive.is_set)
    assert (result.ok, result.phase) == (False, "health")
    assert "server exited while loading" in result.reason
    assert time.monotonic() - started < 5


def test_health_error_status_fails_without_waiting() -> None:
    replies = openai_replies()
    replies["/health"] = (503, "engine dead")
    with local_server(replies) as (url, _):
        result = run_gate(config(url, load_timeout=600))
    assert (result.ok, result.phase) == (False, "health")
    assert "503" in result.reason


def test_llama_servers_loading_answer_is_waited_for_until_it_serves() -> None:
    """llama-server answers /health with 503 "Loading model" while it loads: the gate waits."""
    replies = openai_replies()
    replies["/health"] = (503, {"error": LOADING})
    with local_server(replies) as (url, _):
        threading.Timer(0.4, lambda: replies.update({"/health": (200, {"status": "ok"})})).start()
        started = time.monotonic()
        result = run_gate(config(url, load_timeout=30))
    assert result.ok, result.reason
    assert result.seconds["health"] >= 0.3 and time.monotonic() - started < 10


def test_a_model_that_never_loads_fails_at_the_load_timeout_with_the_answer() -> None:
    replies = openai_replies()
    replies["/health"] = (503, {"error": LOADING})
    with local_server(replies) as (url, _):
        result = run_gate(config(url, load_timeout=0.5))
    assert (result.ok, result.phase) == (False, "health")
    assert "did not answer within 0.5 s" in result.reason and "Loading model" in result.reason


def test_served_name_missing_fails_in_models_and_lists_what_is_served() -> None:
    with local_server(openai_replies(model="other-model")) as (url, routes):
        result = run_gate(config(url))
    assert (result.ok, result.phase) == (False, "models")
    assert "'tiny'" in result.reason and "other-model" in result.reason
    assert not any(method == "POST" for method, *_ in routes.seen)


def test_api_key_is_sent_as_bearer_token_on_every_call() -> None:
    with local_server(openai_replies()) as (url, routes):
        assert run_gate(config(url, api_key="s3cret")).ok
    assert [headers.get("Authorization") for _, _, headers, _ in routes.seen] == [
        "Bearer s3cret"
    ] * 3


def test_no_authorization_header_without_a_key() -> None:
    with local_server(openai_replies()) as (url, routes):
        assert run_gate(config(url)).ok
    assert all("Authorization" not in headers for _, _, headers, _ in routes.seen)


@pytest.mark.parametrize(
    ("payload", "endpoint", "message"),
    [
        ([], "completions", "not a JSON object"),
        ({"choices": []}, "completions", "no choices[0]"),
        ({"choices": [{"text": None}]}, "completions", "choices[0].text"),
        ({"choices": [{"text": "x", "error": "boom"}]}, "completions", "boom"),
        ({"choices": [{"message": "x"}]}, "chat_completions", "message.content"),
    ],
)
def test_answer_text_rejects(payload: Any, endpoint: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        answer_text(payload, endpoint)


def test_answer_text_accepts_empty_generation() -> None:
    assert answer_text({"choices": [{"text": ""}]}, "completions") == ""


def test_a_port_that_accepts_but_never_answers_is_polled_with_short_probes() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        result = run_gate(config(url, load_timeout=1.5, probe_timeout=0.3))
    assert (result.ok, result.phase) == (False, "health")
    assert "ReadTimeout" in result.reason
    assert time.monotonic() - started < 3


def test_an_embeddings_endpoint_passes_with_one_vector_per_input() -> None:
    with local_server(openai_replies()) as (url, routes):
        result = run_gate(config(url, endpoint="embeddings", embedding_width=3))
    assert result.ok, result.reason
    assert result.reason == "tiny answered on /v1/embeddings"
    method, path, _, body = routes.seen[-1]
    assert (method, path) == ("POST", "/v1/embeddings")
    assert body == {"model": "tiny", "input": SMOKE_TEXTS}


def test_a_rerank_endpoint_passes_with_one_score_per_document() -> None:
    with local_server(openai_replies()) as (url, routes):
        result = run_gate(config(url, endpoint="rerank"))
    assert result.ok, result.reason
    _, path, _, body = routes.seen[-1]
    assert path == "/v1/rerank"
    assert body == {"model": "tiny", "query": SMOKE_TEXTS[0], "documents": SMOKE_TEXTS}


@pytest.mark.parametrize(
    ("endpoint", "reply", "width", "said"),
    [
        ("embeddings", embeddings_reply([[0.5, float("nan")], [0.0, 1.0]]), None, "not finite"),
        ("embeddings", embeddings_reply([[0.5, 1.0], [0.0, 1.0, 2.0]]), None, "2, 3 numbers"),
        ("embeddings", embeddings_reply([[0.5, 1.0], [0.0, 1.0]]), 768, "not 768"),
        ("embeddings", embeddings_reply([[0.5, 1.0]]), None, "no 2 embeddings"),
        ("embeddings", embeddings_reply([[], []]), None, "not a list of numbers"),
        ("embeddings", {"error": {"message": "input too long"}}, None, "input too long"),
        ("rerank", rerank_reply([0.5]), None, "no 2 scores"),
        ("rerank", rerank_reply([0.5, float("inf")]), None, "finite relevance_score"),
        ("rerank", {"results": [{"index": 0, "relevance_score": 1}] * 2}, None, "twice"),
    ],
)
def test_a_pooling_answer_that_is_not_what_the_endpoint_gives_fails_in_request(
    endpoint: str, reply: Any, width: int | None, said: str
) -> None:
    replies = openai_replies() | {f"/v1/{endpoint}": (200, reply)}
    with local_server(replies) as (url, _):
        result = run_gate(config(url, endpoint=endpoint, embedding_width=width))
    assert (result.ok, result.phase) == (False, "request")
    assert said in result.reason
