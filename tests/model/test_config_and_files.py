"""Config figures, safetensors headers and template rules, on real models' files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epycd.errors import InputError
from epycd.model import config as cfg
from epycd.model.template import template_status
from epycd.model.weights import (
    bytes_from_parameter_counts,
    local_weights_bytes,
    read_safetensors_header,
)
from tests.model.models import (
    BGE_SMALL_PARAMETERS,
    DEEPSEEK_V2_LITE,
    OLMO_2_0425_1B,
    QWEN2_5_VL_7B_INSTRUCT,
    QWEN3_0_6B,
    bge_small_safetensors,
)

TEXT_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "max_position_embeddings",
    "vocab_size",
)


@pytest.mark.parametrize("nested_key", ["text_config", "language_config", "llm_config"])
def test_nested_text_config_gives_the_same_figures(nested_key: str) -> None:
    flat = QWEN2_5_VL_7B_INSTRUCT
    nested: dict[str, Any] = {k: v for k, v in flat.items() if k not in TEXT_KEYS}
    nested[nested_key] = {k: flat[k] for k in TEXT_KEYS}
    assert cfg.kv_bytes_per_token(nested) == cfg.kv_bytes_per_token(flat) == 57344
    assert cfg.max_positions(nested) == 128000


def test_mla_is_one_latent_per_layer_not_doubled() -> None:
    assert cfg.is_mla(DEEPSEEK_V2_LITE)
    assert cfg.kv_bytes_per_token(DEEPSEEK_V2_LITE) == 27 * (512 + 64) * 2


def test_mha_without_kv_heads_or_head_dim() -> None:
    config = {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768}
    assert cfg.kv_bytes_per_token(config) == 2 * 12 * 12 * 64 * 2
    assert cfg.kv_bytes_per_token({"hidden_size": 768}) is None


def test_derived_weights_match_the_model_cards() -> None:
    # Qwen3-0.6B card: 0.44B non-embedding parameters, 151936 x 1024 tied embeddings.
    qwen = cfg.derived_weights_bytes(QWEN3_0_6B)
    assert qwen is not None
    non_embedding = qwen / 2 - 151936 * 1024
    assert non_embedding == pytest.approx(0.44e9, rel=0.01)
    # DeepSeek-V2-Lite card: 15.7B total parameters (MoE, MLA), bf16.
    assert cfg.derived_weights_bytes(DEEPSEEK_V2_LITE) == pytest.approx(2 * 15.7e9, rel=0.02)
    # OLMo-2-0425-1B: 1.48B parameters stored in float32.
    assert cfg.derived_weights_bytes(OLMO_2_0425_1B) == pytest.approx(4 * 1.48e9, rel=0.02)


def test_safetensors_header_of_a_real_layout(tmp_path: Path) -> None:
    path = bge_small_safetensors(tmp_path)
    header = read_safetensors_header(path)
    assert header.tensors["encoder.layer.11.output.dense.weight"].shape == (384, 1536)
    assert header.data_bytes == 4 * BGE_SMALL_PARAMETERS
    header_length = int.from_bytes(path.read_bytes()[:8], "little")
    assert header.data_bytes == path.stat().st_size - 8 - header_length
    folder = tmp_path / "model"
    folder.mkdir()
    path.rename(folder / "model.safetensors")
    assert local_weights_bytes(folder) == (4 * BGE_SMALL_PARAMETERS, "safetensors-header")


def test_broken_safetensors_is_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(InputError, match="its header is not JSON"):
        read_safetensors_header(bad)


def test_hub_parameter_counts_in_bytes() -> None:
    assert bytes_from_parameter_counts({"BF16": 1000, "F32": 10, "I8": 3}) == 2043


def _folder(tmp_path: Path, tokenizer_config: Any = None, jinja: str | None = None) -> Path:
    if tokenizer_config is not None:
        text = (
            tokenizer_config if isinstance(tokenizer_config, str) else json.dumps(tokenizer_config)
        )
        (tmp_path / "tokenizer_config.json").write_text(text)
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return tmp_path


def test_template_rules(tmp_path: Path) -> None:
    def status(name: str, **kwargs: Any) -> tuple[str, list[str]]:
        folder = tmp_path / name
        folder.mkdir()
        result = template_status(_folder(folder, **kwargs))
        return result.status, result.names

    assert status("jinja", jinja="{{ messages }}", tokenizer_config={}) == ("present", [])
    assert status("empty-jinja", jinja="  \n", tokenizer_config={}) == ("absent", [])
    assert status("string", tokenizer_config={"chat_template": "{{ x }}"}) == ("present", [])
    listed = [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]
    assert status("default", tokenizer_config={"chat_template": listed}) == (
        "present",
        ["default", "tool_use"],
    )
    several = [{"name": "rag", "template": "a"}, {"name": "tool_use", "template": "b"}]
    assert status("ambiguous", tokenizer_config={"chat_template": several}) == (
        "ambiguous",
        ["rag", "tool_use"],
    )
    single = [{"name": "tool_use", "template": "b"}]
    assert status("single", tokenizer_config={"chat_template": single}) == ("present", ["tool_use"])
    assert status("none", tokenizer_config={"model_max_length": 4096}) == ("absent", [])
    processor = tmp_path / "processor"
    processor.mkdir()
    (processor / "chat_template.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert template_status(_folder(processor, tokenizer_config={})).status == "present"
    assert status("broken", tokenizer_config="{not json") == ("unknown", [])
    assert status("missing") == ("unknown", [])
