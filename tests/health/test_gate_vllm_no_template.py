"""A real vLLM serving a model without a chat template: the chat gate fails in phase request,
the completions gate passes. A 200 from /health and /v1/models is not enough."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.health import GateConfig, run_gate
from tests.health.realvllm import VllmServer, build_tiny_model, free_port, serve_argv

pytestmark = [pytest.mark.vllm, pytest.mark.serves]


def test_chat_without_template_fails_in_request_completions_pass(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "no-template", chat_template=False)
    port = free_port()
    server = VllmServer(serve_argv(model, port, "tiny"), tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        chat = run_gate(
            GateConfig(url=url, served_model_name="tiny", load_timeout=300), server.alive
        )
        completions = run_gate(
            GateConfig(url=url, served_model_name="tiny", endpoint="completions", load_timeout=5),
            server.alive,
        )
    finally:
        server.stop()
    assert (chat.ok, chat.phase) == (False, "request"), server.log_text()[-3000:]
    assert "/v1/chat/completions answered HTTP 400" in chat.reason
    assert "template" in chat.reason.lower()
    assert set(chat.seconds) == {"health", "models", "request"}
    assert completions.ok, completions.reason
