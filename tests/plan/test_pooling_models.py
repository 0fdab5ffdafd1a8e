"""Embedding and reranker models in endpoint files: check-model calls them servable on
their own endpoints, and the plan refuses them, for now, with that reason and what serves
them meanwhile; the other endpoints plan as before."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epycd.host.facts import HostFacts
from tests.model.gguf_files import GgufShape, write_gguf
from tests.model.hf_cache import add_to_cache
from tests.model.models import model_files
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_llama_plan import LlamaWorkspace

HostOf = Callable[..., HostFacts]


@pytest.mark.parametrize(
    ("model", "kind", "path"),
    [
        ("BAAI/bge-small-en-v1.5", "an embedding model", "/v1/embeddings"),
        ("BAAI/bge-reranker-base", "a reranker", "/v1/rerank"),
    ],
)
def test_a_pooling_model_is_refused_with_its_kind_and_the_others_plan(
    ws: PlanWorkspace,
    host_of: HostOf,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    kind: str,
    path: str,
) -> None:
    for repo_id, files in model_files().items():
        add_to_cache(ws.hf_home / "hub", repo_id, files)
    monkeypatch.setenv("HF_HOME", str(ws.hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ws.endpoint("pooled", f'model = "{model}"\n')
    ws.endpoint("chat")
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    [problem] = results["pooled"].errors
    assert problem.key == "model"
    assert f"is {kind} ({path})" in problem.text
    assert "--runner pooling" in (problem.fix or "")
    assert results["chat"].plan is not None


@pytest.mark.parametrize(
    ("architecture", "pooling", "flag"),
    [("bert", None, "--embeddings"), ("qwen2", 4, "--rerank")],
)
def test_a_pooling_gguf_is_refused_by_llama_cpp_with_its_flag_and_the_others_plan(
    ws: PlanWorkspace, host_of: HostOf, architecture: str, pooling: int | None, flag: str
) -> None:
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))
    path = ws.tmp / "pooled.gguf"
    extra = {} if pooling is None else {"{arch}.pooling_type": pooling}
    write_gguf(path, GgufShape(architecture=architecture, extra=extra))
    lw.endpoint("pooled", f'model = "{path}"\n')
    lw.endpoint("chat")
    results = lw.plan()
    [problem] = results["pooled"].errors
    assert problem.key == "model"
    assert "not yet embeddings or rerank" in problem.text
    assert f"llama-server {flag}" in (problem.fix or "")
    assert results["chat"].plan is not None
