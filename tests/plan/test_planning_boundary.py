"""The planning boundary: each endpoint is planned on its own. A refusal of one llama.cpp
endpoint is that endpoint's own error (its result keeps its llama-server route), and what no
rule foresaw in one endpoint is its own failure, one line with its traceback in the journal,
while every other endpoint plans as if it were absent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from epycd.engines.llama_cpp.plan.model import LlamaRoute
from epycd.errors import UNEXPECTED_LOG
from epycd.host.facts import HostFacts
from epycd.plan.engines import planner_for
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.ports import assign_ports
from tests.model.gguf_files import GgufShape, write_gguf
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_llama_plan import LlamaWorkspace


@pytest.fixture
def lw(ws: PlanWorkspace, host_of: Callable[..., HostFacts]) -> LlamaWorkspace:
    return LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))


def refused(result: EndpointResult, key: str, words: str) -> None:
    """Refused with its own error on `key`, its llama-server route kept."""
    assert result.plan is None
    texts = [error.text for error in result.errors]
    assert any(error.key == key and words in error.message for error in result.errors), texts
    assert isinstance(result.route, LlamaRoute), result.route


def planned(result: EndpointResult) -> None:
    assert result.plan is not None, [error.text for error in result.errors]


def other_gguf(lw: LlamaWorkspace, name: str, **changes: Any) -> Path:
    shape = GgufShape(layers=2, embedding=128, heads=4, kv_heads=2, feed_forward=512, vocab=300)
    for key, value in changes.items():
        setattr(shape, key, value)
    path = lw.ws.tmp / "models" / f"{name}.gguf"
    write_gguf(path, shape)
    return path


def test_two_llama_files_on_socket_0_the_second_is_refused_the_first_plans(
    lw: LlamaWorkspace,
) -> None:
    lw.endpoint("a", "socket = 0\n")
    lw.endpoint("b", "socket = 0\n")
    results = lw.plan()
    planned(results["a"])
    assert results["a"].plan is not None and results["a"].plan.decisions.socket == 0
    refused(results["b"], "socket", "taken by a")
    assert results["b"].exit_code == 1


def test_a_model_llama_cpp_cannot_account_is_refused_and_the_others_plan(
    lw: LlamaWorkspace,
) -> None:
    """An architecture the formulas do not cover is asked of llama-server's own pass; this
    workspace's stand-in prints no memory table, so the endpoint is refused on its model."""
    gemma = other_gguf(lw, "gemma", architecture="gemma3")
    lw.endpoint("a-gemma", f'model = "{gemma}"\n')
    lw.endpoint("b-qwen")
    results = lw.plan()
    refused(results["a-gemma"], "model", "llama.cpp cannot say the memory of serving gemma")
    planned(results["b-qwen"])


def test_a_gguf_without_a_context_length_is_refused_with_the_fix(lw: LlamaWorkspace) -> None:
    bare = other_gguf(lw, "no-context", context=None)
    lw.endpoint("a-bare", f'model = "{bare}"\n')
    lw.endpoint("b-qwen")
    results = lw.plan()
    refused(results["a-bare"], "max_model_len", "gives no context length")
    planned(results["b-qwen"])
    lw.endpoint("a-bare", f'model = "{bare}"\nmax_model_len = 2048\n')
    planned(lw.plan()["a-bare"])


def test_a_port_range_that_does_not_fit_is_refused(lw: LlamaWorkspace) -> None:
    lw.endpoint("a-set", "instances = 2\nport = 65535\n")
    lw.endpoint("b-one")
    results = lw.plan()
    refused(results["a-set"], "port", "free ports above 65535")
    planned(results["b-one"])


def explode(*_args: object, **_kwargs: object) -> object:
    raise RuntimeError("no rule foresaw this: secret-content-of-a-file")


def crashed_alone(result: EndpointResult, doing: str) -> str:
    """The one line of an endpoint whose planning raised: refused (exit 1), naming its file
    and where the traceback is, quoting nothing of the exception's text."""
    assert result.plan is None and result.exit_code == 1
    (error,) = result.errors
    assert error.file == result.config_file
    assert f"{doing} failed unexpectedly (RuntimeError)" in error.message, error.text
    assert error.fix and "journalctl" in error.fix
    assert "secret-content" not in error.text and "\n" not in error.text
    return error.text


def test_an_endpoint_that_raises_while_prepared_is_its_own_failure(
    lw: LlamaWorkspace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lw.endpoint("a")
    alone = lw.plan()["a"]
    lw.endpoint("b", "socket = 0\n")
    planner = planner_for("llama.cpp")
    real = planner.prepare

    def flaky(result: Any, *args: Any, **kwargs: Any) -> Any:
        return explode() if result.name == "b" else real(result, *args, **kwargs)

    monkeypatch.setattr(planner, "prepare", flaky)
    with caplog.at_level(logging.ERROR, logger=UNEXPECTED_LOG):
        results = lw.plan()
    crashed_alone(results["b"], "preparing the endpoint")
    assert results["a"].plan == alone.plan
    (record,) = [r for r in caplog.records if r.name == UNEXPECTED_LOG]
    assert record.exc_info and "b.toml" in record.getMessage()


def test_an_endpoint_that_raises_while_decided_gives_back_its_socket(
    lw: LlamaWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    lw.endpoint("b")
    alone = lw.plan()["b"]
    lw.endpoint("a", "socket = 0\n")

    planner = planner_for("llama.cpp")
    real = planner.decide

    def flaky(prepared: Any, **kwargs: Any) -> Any:
        return explode() if prepared.result.name == "a" else real(prepared, **kwargs)

    monkeypatch.setattr(planner, "decide", flaky)
    results = lw.plan()
    crashed_alone(results["a"], "planning the endpoint")
    assert results["b"].plan == alone.plan


def test_an_endpoint_that_makes_placing_raise_is_left_out(
    lw: LlamaWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    lw.endpoint("a")
    lw.endpoint("c")
    before = lw.plan()
    lw.endpoint("b")

    def flaky(requests: Any, *args: Any, **kwargs: Any) -> Any:
        if any(request.name == "b" for request in requests):
            explode()
        return assign_ports(requests, *args, **kwargs)

    monkeypatch.setattr("epycd.plan.pipeline.place.assign_ports", flaky)
    results = lw.plan()
    crashed_alone(results["b"], "placing the endpoint beside the others")
    assert results["a"].plan == before["a"].plan and results["c"].plan == before["c"].plan
