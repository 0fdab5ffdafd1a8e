"""Model facts of real models, read offline from a real HF cache layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir

from epycd.engines.vllm.model import format as vllm_format
from epycd.engines.vllm.model.format import pinned_vllm_version
from epycd.errors import InputError, Refusal
from epycd.model.check import inspect_model
from tests.model.hf_cache import add_to_cache, commit_for, repo_folder
from tests.model.models import (
    BGE_SMALL_PARAMETERS,
    CHATML,
    LLAMA_8B_TOTAL_SIZE,
    QWEN3_0_6B,
)

pytestmark = pytest.mark.usefixtures("offline_hub")

# (model, kind, template status, primary endpoint, launchable)
CLASSIFIED = [
    ("Qwen/Qwen3-0.6B", "text", "present", "chat_completions", True),
    ("meta-llama/Llama-3.1-8B-Instruct", "text", "present", "chat_completions", True),
    ("deepseek-ai/DeepSeek-V2-Lite", "text", "unknown", "completions", True),
    ("allenai/OLMo-2-0425-1B", "text", "absent", "completions", True),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "multimodal", "present", "chat_completions", True),
    ("BAAI/bge-small-en-v1.5", "embedding", "absent", "embeddings", True),
    ("BAAI/bge-reranker-base", "rerank", "absent", "rerank", True),
    ("cardiffnlp/twitter-roberta-base-sentiment-latest", "classify", "unknown", None, False),
    ("THUDM/glm-4-9b-chat-hf", "text", "present", "chat_completions", True),
    ("google-t5/t5-small", "unsupported", "unknown", None, False),
]


@pytest.mark.parametrize("vllm_version", ["0.25.1", "0.32.0"])
@pytest.mark.parametrize(("model", "kind", "status", "primary", "launchable"), CLASSIFIED)
def test_classification(
    model: str, kind: str, status: str, primary: str | None, launchable: bool, vllm_version: str
) -> None:
    facts = inspect_model(model, vllm_version=vllm_version)
    assert facts.support.kind == kind
    assert facts.support.supported is (kind != "unsupported")
    assert facts.support.table_version == vllm_version
    assert facts.chat_template.status == status
    assert facts.primary_endpoint == primary
    assert facts.launchable is launchable
    assert facts.revision == commit_for(model)
    assert facts.gated is None  # offline: the cache does not say


def test_endpoints_follow_the_template() -> None:
    assert inspect_model("Qwen/Qwen3-0.6B").supported_endpoints == [
        "chat_completions",
        "completions",
    ]
    assert inspect_model("allenai/OLMo-2-0425-1B").supported_endpoints == ["completions"]
    assert inspect_model("BAAI/bge-small-en-v1.5").supported_endpoints == ["embeddings"]


def test_default_version_is_the_pinned_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert inspect_model("Qwen/Qwen3-0.6B").support.vllm_version == pinned_vllm_version()
    monkeypatch.setattr(vllm_format, "data_dir", lambda: tmp_path)
    assert pinned_vllm_version() == "0.25.1"  # no data/epyc.json yet
    (tmp_path / "epyc.json").write_text(json.dumps({"vllm_version": "0.32.0"}))
    assert pinned_vllm_version() == "0.32.0"
    assert inspect_model("Qwen/Qwen3-0.6B").support.vllm_version == "0.32.0"


def test_version_without_a_table_uses_the_nearest_lower_with_a_warning() -> None:
    facts = inspect_model("THUDM/glm-4-9b-chat-hf", vllm_version="0.29.0")
    assert facts.support.table_version == "0.25.1"
    assert facts.support.kind == "text"
    assert any("0.29.0" in w for w in facts.warnings)


def test_kv_bytes_per_token() -> None:
    assert inspect_model("Qwen/Qwen3-0.6B").kv_bytes_per_token == 114688
    mla = inspect_model("deepseek-ai/DeepSeek-V2-Lite")
    assert mla.kv_bytes_per_token == 31104
    assert mla.is_mla
    assert inspect_model("meta-llama/Llama-3.1-8B-Instruct").kv_bytes_per_token == 131072
    assert inspect_model("THUDM/glm-4-9b-chat-hf").kv_bytes_per_token == 40960
    assert inspect_model("Qwen/Qwen2.5-VL-7B-Instruct").kv_bytes_per_token == 57344


def test_weights_from_index_header_and_config() -> None:
    llama = inspect_model("meta-llama/Llama-3.1-8B-Instruct")
    assert (llama.weights_bytes, llama.weights_source) == (LLAMA_8B_TOTAL_SIZE, "safetensors-index")
    bge = inspect_model("BAAI/bge-small-en-v1.5")
    assert (bge.weights_bytes, bge.weights_source) == (
        4 * BGE_SMALL_PARAMETERS,
        "safetensors-header",
    )
    qwen = inspect_model("Qwen/Qwen3-0.6B")
    assert qwen.weights_source == "derived"
    assert any("estimated from config.json" in w for w in qwen.warnings)


def test_multimodal_without_a_template_is_not_launchable(tmp_path: Path, offline_hub: Path) -> None:
    snapshot = repo_folder(offline_hub / "hub", "Qwen/Qwen2.5-VL-7B-Instruct") / "snapshots"
    folder = tmp_path / "qwen-vl-no-template"
    shutil.copytree(next(snapshot.iterdir()), folder)
    tokenizer_config = folder / "tokenizer_config.json"
    data = json.loads(tokenizer_config.read_text())
    del data["chat_template"]
    tokenizer_config.unlink()  # a symlink into the cache: replace, never write through
    tokenizer_config.write_text(json.dumps(data))
    facts = inspect_model(str(folder))
    assert facts.support.kind == "multimodal"
    assert facts.chat_template.status == "absent"
    assert (facts.launchable, facts.primary_endpoint, facts.supported_endpoints) == (
        False,
        None,
        [],
    )
    assert "needs a chat template" in facts.message
    assert facts.revision is None and facts.local_path == str(folder)


def test_endpoint_file_template_overrides(tmp_path: Path) -> None:
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    facts = inspect_model("allenai/OLMo-2-0425-1B", chat_template_override=str(template))
    assert facts.chat_template.status == "present"
    assert facts.chat_template.source == "the endpoint file"
    assert facts.primary_endpoint == "chat_completions"
    with pytest.raises(InputError, match="chat_template"):
        inspect_model("allenai/OLMo-2-0425-1B", chat_template_override=str(tmp_path / "none"))


def test_revision_selects_a_snapshot_offline(offline_hub: Path) -> None:
    older = "0" * 40
    add_to_cache(
        offline_hub / "hub",
        "Qwen/Qwen3-0.6B",
        {"config.json": json.dumps({**QWEN3_0_6B, "num_hidden_layers": 14}).encode()},
        commit=older,
        ref="older-branch",
    )
    (repo_folder(offline_hub / "hub", "Qwen/Qwen3-0.6B") / "refs" / "main").write_text(
        commit_for("Qwen/Qwen3-0.6B")
    )
    assert inspect_model("Qwen/Qwen3-0.6B", revision=older).kv_bytes_per_token == 114688 // 2
    assert inspect_model("Qwen/Qwen3-0.6B", revision="older-branch").revision == older
    assert inspect_model("Qwen/Qwen3-0.6B").kv_bytes_per_token == 114688
    with pytest.raises(Refusal, match="not in the local cache"):
        inspect_model("Qwen/Qwen3-0.6B", revision="no-such-branch")


def test_the_fixture_is_a_cache_huggingface_hub_itself_reads(offline_hub: Path) -> None:
    scanned = scan_cache_dir(offline_hub / "hub")
    assert not scanned.warnings
    repos = {repo.repo_id: repo for repo in scanned.repos}
    assert "meta-llama/Llama-3.1-8B-Instruct" in repos
    revision = next(iter(repos["BAAI/bge-small-en-v1.5"].revisions))
    assert {f.file_name for f in revision.files} >= {"config.json", "model.safetensors"}


def test_bad_model_names_are_bad_input() -> None:
    with pytest.raises(InputError, match="org/name"):
        inspect_model("relative/path/to/model")
    with pytest.raises(InputError, match="org/name"):
        inspect_model("Qwen3-0.6B")
    with pytest.raises(InputError, match="not a valid hub id"):
        inspect_model("Qwen/Qwen3 0.6B!")
    with pytest.raises(InputError, match=r"config\.json"):
        inspect_model("/nonexistent/model/folder")


def test_an_embedders_and_a_rerankers_input_limit_is_the_one_vllm_derives() -> None:
    """sentence-transformers' max_seq_length where the model has one (bge-small); else the
    positions cut to the tokenizer's model_max_length (bge-reranker-base: 514 positions, a
    512-token tokenizer); none for a generating model."""
    assert inspect_model("BAAI/bge-small-en-v1.5").max_input_tokens == 512
    reranker = inspect_model("BAAI/bge-reranker-base")
    assert (reranker.max_position_embeddings, reranker.max_input_tokens) == (514, 512)
    assert inspect_model("Qwen/Qwen3-0.6B").max_input_tokens is None


def test_an_embedders_width_is_its_hidden_size_unless_a_projection_follows(
    tmp_path: Path,
) -> None:
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
              "vocab_size": 1000}  # fmt: skip
    folder = tmp_path / "embedder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert inspect_model(str(folder)).embedding_width == 96
    st = "sentence_transformers.models."
    pooled = [{"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"}]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(pooled))
    assert inspect_model(str(folder)).embedding_width == 96, "pooling keeps the width"
    projected = [*pooled, {"idx": 2, "name": "2", "path": "2_Dense", "type": st + "Dense"}]
    (folder / "modules.json").write_text(json.dumps(projected))
    assert inspect_model(str(folder)).embedding_width is None, "a Dense layer changes it"
    (folder / "modules.json").write_text("{not json")
    assert inspect_model(str(folder)).embedding_width is None
    assert inspect_model("BAAI/bge-reranker-base").embedding_width is None


def test_a_text_generator_with_a_sentence_transformers_pooling_module_is_an_embedder(
    tmp_path: Path,
) -> None:
    """Qwen3-Embedding's shape: a Qwen3ForCausalLM with modules.json's pooling module is an
    embedder (vLLM's own rule), said in a warning; without the module, or with modules.json
    listing no pooling module, the same config is a text model."""
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "max_position_embeddings": 1024, "vocab_size": 1000}  # fmt: skip
    folder = tmp_path / "qwen3-embedder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert (
        inspect_model(str(folder)).support.kind,
        inspect_model(str(folder)).embedding_width,
    ) == ("text", None)
    st = "sentence_transformers.models."
    transformer = {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"}
    (folder / "modules.json").write_text(json.dumps([transformer]))
    assert inspect_model(str(folder)).support.kind == "text"
    pooling = {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"}
    (folder / "modules.json").write_text(json.dumps([transformer, pooling]))
    facts = inspect_model(str(folder))
    assert (facts.support.kind, facts.primary_endpoint, facts.embedding_width) == (
        "embedding",
        "embeddings",
        64,
    )
    assert any("modules.json pools its output" in w for w in facts.warnings), facts.warnings
