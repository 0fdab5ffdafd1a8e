"""The online path against a local stand-in for the hub (tests/model/fake_hub.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.errors import InputError, Refusal
from epycd.model.check import inspect_model
from tests.model.fake_hub import FakeRepo, fake_hub
from tests.model.hf_cache import commit_for
from tests.model.models import LLAMA_8B_TOTAL_SIZE, model_files

QWEN_PARAMETERS = {"BF16": 751_632_384}  # the hub's safetensors summary of Qwen3-0.6B
TOKEN = "hf_test_token"


@pytest.fixture
def hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, FakeRepo], Path]]:
    files = model_files()
    qwen = dict(files["Qwen/Qwen3-0.6B"])
    qwen |= {"README.md": b"# Qwen3-0.6B", "model.safetensors": b"not fetched"}
    repos = {
        "Qwen/Qwen3-0.6B": FakeRepo(
            files={k: v for k, v in qwen.items() if isinstance(v, bytes)},
            safetensors_parameters=QWEN_PARAMETERS,
        ),
        "meta-llama/Llama-3.1-8B-Instruct": FakeRepo(
            files={
                k: v for k, v in files["meta-llama/Llama-3.1-8B-Instruct"].items()
                if isinstance(v, bytes)
            },
            gated="manual",
            token=TOKEN,
        ),
    }  # fmt: skip
    home = tmp_path / "hf_home"
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    with fake_hub(repos) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield url, repos, home


def test_online_reads_small_files_pins_the_commit_and_uses_hub_metadata(
    hub: tuple[str, dict[str, FakeRepo], Path],
) -> None:
    _, repos, home = hub
    facts = inspect_model("Qwen/Qwen3-0.6B")
    assert facts.revision == commit_for("Qwen/Qwen3-0.6B")
    assert facts.gated is False
    assert (facts.weights_bytes, facts.weights_source) == (2 * 751_632_384, "hub-metadata")
    assert facts.chat_template.status == "present"
    assert not facts.warnings
    fetched = [r for r in repos["Qwen/Qwen3-0.6B"].requests if "/resolve/" in r]
    assert fetched and not any(r.endswith(("README.md", "model.safetensors")) for r in fetched)
    snapshot = home / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / facts.revision
    assert (snapshot / "config.json").exists()


def test_what_was_fetched_online_answers_offline_later(
    hub: tuple[str, dict[str, FakeRepo], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    online = inspect_model("Qwen/Qwen3-0.6B")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = inspect_model("Qwen/Qwen3-0.6B")
    assert offline.revision == online.revision
    assert offline.kv_bytes_per_token == online.kv_bytes_per_token == 114688


def test_gated_model_needs_a_token(hub: tuple[str, dict[str, FakeRepo], Path]) -> None:
    with pytest.raises(Refusal, match="gated") as refused:
        inspect_model("meta-llama/Llama-3.1-8B-Instruct")
    assert refused.value.exit_code == 1
    assert "HF_TOKEN or hf_token_file" in str(refused.value)
    facts = inspect_model("meta-llama/Llama-3.1-8B-Instruct", token=TOKEN)
    assert facts.gated is True
    assert (facts.weights_bytes, facts.weights_source) == (LLAMA_8B_TOTAL_SIZE, "safetensors-index")


def test_unknown_repo_and_revision_are_bad_input(
    hub: tuple[str, dict[str, FakeRepo], Path],
) -> None:
    with pytest.raises(InputError, match="not on the hub"):
        inspect_model("Qwen/No-Such-Model")
    with pytest.raises(InputError, match="no revision"):
        inspect_model("Qwen/Qwen3-0.6B", revision="no-such-branch")
