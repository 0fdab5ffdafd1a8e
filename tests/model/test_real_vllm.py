"""A real vLLM (tests/tools/vllm_venv.sh) confirms the tables, the registry answer and the
endpoint chosen from the chat template, end to end with the tiny model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from epycd.engines.vllm.model.registry_tables import load_table
from epycd.engines.vllm.model.support import installed_registry
from epycd.model.check import inspect_model
from tests.health.pooling_models import tiny_bert
from tests.health.realvllm import (
    VllmServer,
    build_tiny_model,
    free_port,
    serve_argv,
    vllm_executable,
)

pytestmark = [pytest.mark.vllm, pytest.mark.serves]
HEALTHY_WITHIN_S = 300.0


def test_the_real_registry_equals_the_table_made_from_its_wheel() -> None:
    version, supported, sections = installed_registry(vllm_executable())
    table = load_table("0.32.0")
    assert version.startswith("0.32.0")
    assert sections == table.sections
    assert {"Qwen2ForCausalLM", "GlmForCausalLM", "BertModel"} <= supported


@pytest.fixture
def served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, str, VllmServer]]:
    chat_template: bool = request.param
    model = build_tiny_model(tmp_path / "model", chat_template=chat_template)
    port = free_port()
    server = VllmServer(serve_argv(model, port, "tiny"), tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(base, HEALTHY_WITHIN_S)
        yield model, base, server
    finally:
        server.stop()


def answer_and_log(reply: httpx.Response, server: VllmServer) -> str:
    """What a failed request needs to be understood: the answer and the server's own log."""
    return f"{reply.status_code} {reply.text[:1000]}\n--- vLLM log ---\n{server.log_text()[-4000:]}"


def ask(base: str, endpoint: str) -> httpx.Response:
    body: dict[str, object] = {"model": "tiny", "max_tokens": 8, "temperature": 0}
    if endpoint == "chat_completions":
        body["messages"] = [{"role": "user", "content": "hello"}]
        return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    # A sentence, not one word: vLLM 0.32's AMX attention (chosen where torch says AMX works)
    # died with SIGILL on a one-token first prompt on an Intel Xeon VM whose AMX is
    # advertised but faults; what this test asserts is the template and the endpoints.
    body["prompt"] = "Write one short sentence about the sea."
    return httpx.post(f"{base}/v1/completions", json=body, timeout=120)


@pytest.mark.parametrize("served", [True], indirect=True)
def test_a_model_with_a_template_answers_on_chat(
    served: tuple[Path, str, VllmServer],
) -> None:
    model, base, server = served
    facts = inspect_model(str(model), vllm_executable=str(vllm_executable()))
    assert facts.support.source == "installed-vllm"
    assert (facts.support.kind, facts.chat_template.status) == ("text", "present")
    assert facts.primary_endpoint == "chat_completions"
    for endpoint in facts.supported_endpoints:
        reply = ask(base, endpoint)
        assert reply.status_code == 200, answer_and_log(reply, server)
        assert reply.json()["choices"]


@pytest.mark.parametrize("served", [False], indirect=True)
def test_a_model_without_a_template_answers_on_completions_only(
    served: tuple[Path, str, VllmServer],
) -> None:
    model, base, server = served
    facts = inspect_model(str(model), vllm_executable=str(vllm_executable()))
    assert facts.support.source == "installed-vllm"
    assert facts.chat_template.status == "absent"
    assert (facts.primary_endpoint, facts.supported_endpoints) == ("completions", ["completions"])
    reply = ask(base, "completions")
    assert reply.status_code == 200, answer_and_log(reply, server)
    refused = ask(base, "chat_completions")
    assert refused.status_code >= 400, "vLLM invented a chat template"


@pytest.mark.parametrize(
    ("name", "kind", "primary"),
    [("embedder", "embedding", "embeddings"), ("reranker", "rerank", "rerank")],
)
def test_the_real_registry_knows_the_tiny_bert_pair_as_the_tables_do(
    name: str, kind: str, primary: str
) -> None:
    """A BertModel embeds; a one-label BertForSequenceClassification reranks: the installed
    vLLM's registry and the shipped table give the same answer."""
    model = str(tiny_bert(name))
    installed = inspect_model(model, vllm_executable=str(vllm_executable()))
    tabled = inspect_model(model, vllm_version="0.32.0")
    assert installed.support.source == "installed-vllm"
    assert (installed.support.kind, installed.primary_endpoint) == (kind, primary)
    assert (tabled.support.kind, tabled.primary_endpoint) == (kind, primary)
    assert installed.launchable and tabled.launchable
