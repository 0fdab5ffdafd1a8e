"""Every registered engine's server facts (epycd.engines) against its real server: each
metric name it gives is in the server's real /metrics, under the engine's prefix; the
exposition is recognised as that engine's, and no other's; its API key variable is one the
supervisor accepts. vLLM's exposition is recorded from the real 0.32.0 CPU server
(tests/metrics); llama-server's is read from the real build now."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from epycd.engines import ENGINES, Engine, engine_exporting, engine_named
from epycd.health import parse_progress
from epycd.metrics.load import parse_sample
from epycd.supervisor.__main__ import main as supervisor_main
from tests.engines.endpoints import ENGINES as TESTED_ENGINES
from tests.engines.endpoints import engine_lines
from tests.llama.realllama import serving
from tests.metrics.servers import recorded

pytestmark = pytest.mark.llama


def llama_exposition() -> str:
    with serving("-c", "1024") as url:
        httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60)
        return httpx.get(f"{url}/metrics", timeout=10).text


EXPOSITIONS = {"vllm": recorded, "llama.cpp": llama_exposition}
"""Each engine's real /metrics: a registered engine without one fails here."""


@pytest.fixture(scope="module", params=[e.name for e in ENGINES])
def engine_and_text(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, str]]:
    name = request.param
    assert name in EXPOSITIONS, f"no real /metrics of {name} to check its names against"
    yield engine_named(name), EXPOSITIONS[name]()


def test_every_name_is_in_the_real_exposition_under_the_prefix(
    engine_and_text: tuple[Engine, str],
) -> None:
    engine, text = engine_and_text
    for name in engine.metrics.load:
        assert name.startswith(engine.metrics.prefix), name
        assert f"\n{name}" in text or text.startswith(name), f"{name} not in {engine.name}'s"


def test_the_exposition_is_read_as_its_engines(engine_and_text: tuple[Engine, str]) -> None:
    engine, text = engine_and_text
    assert engine_exporting(text) is engine
    others = [e for e in ENGINES if e is not engine]
    assert not any(e.metrics.prefix in text for e in others)
    sample = parse_sample(text, at=0.0)
    assert (sample.kv_cache_usage is None) == (engine.metrics.kv_usage is None)
    assert sample.tokens > 0
    assert parse_progress(text).tokens == sample.tokens


def test_an_exposition_of_no_engine_is_refused_naming_each_engines_gauge() -> None:
    with pytest.raises(ValueError) as refused:
        parse_sample("# not a server of any engine\nup 1\n", at=0.0)
    assert all(e.metrics.running in str(refused.value) for e in ENGINES)


def test_the_supervisor_accepts_each_engines_key_variable_and_no_other() -> None:
    help_text = CliRunner().invoke(supervisor_main, ["--help"]).output
    assert all(e.api_key_env in help_text for e in ENGINES)
    wrong = CliRunner().invoke(
        supervisor_main, ["--name", "x", "--url", "u", "--served-model-name", "m",
                          "--api-key-env", "OPENAI_API_KEY"],
    )  # fmt: skip
    assert wrong.exit_code == 2 and "OPENAI_API_KEY" in wrong.output


def test_engines_are_named_once_and_each_is_in_the_engine_wide_tests(tmp_path: Path) -> None:
    names = [e.name for e in ENGINES]
    assert len(set(names)) == len(names)
    assert list(TESTED_ENGINES) == names
    for name in names:
        assert engine_lines(tmp_path, name).startswith(f'engine = "{name}"') or name == "vllm"
    with pytest.raises(KeyError):
        engine_named("no-such-engine")
