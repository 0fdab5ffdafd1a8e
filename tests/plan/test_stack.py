"""data/epyc.json: the validated stack, loaded and checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from epycd.errors import InputError
from epycd.stack import load_stack, parse_stack, stack_path


def test_shipped_stack_is_the_validated_one() -> None:
    stack = load_stack()
    assert stack.vllm_version == "0.25.1"
    assert stack.zentorch_version == "2.11.0.3"
    assert stack.image == (
        "docker.io/amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"
    )
    assert stack.stock_image_pinned == "docker.io/vllm/vllm-openai-cpu:v0.25.1-x86_64"
    assert stack.stock_image.entrypoint_is_vllm_serve and not stack.image_entrypoint_is_vllm_serve
    assert stack.run_flags == ["--ipc=host", "--network=host", "--cap-add=SYS_NICE"]
    assert stack.throughput_flags == {
        "TORCHINDUCTOR_FREEZING": "1",
        "VLLM_USE_AOT_COMPILE": "0",
        "ZENTORCH_WEIGHT_PREPACK": "1",
    }
    assert stack.precisions[0] == stack.default_dtype == "bfloat16"
    assert stack.default_model == "Qwen/Qwen3-0.6B"
    assert stack.content_sha256 == hashlib.sha256(stack_path().read_bytes()).hexdigest()
    assert stack.gated_family("meta-llama/Llama-3.1-8B") is not None
    assert stack.gated_family("Qwen/Qwen3-0.6B") is None


def _edited(tmp_path: Path, **changes: object) -> Path:
    data = json.loads(stack_path().read_text())
    data.update(changes)
    path = tmp_path / "epyc.json"
    path.write_text(json.dumps(data))
    return path


def test_image_and_vllm_version_must_agree(tmp_path: Path) -> None:
    path = _edited(tmp_path, vllm_version="0.26.0")
    with pytest.raises(InputError) as caught:
        load_stack(path)
    assert caught.value.key == "image" and caught.value.file == str(path)
    assert "0.26.0" in str(caught.value)


def test_throughput_set_is_three_flags(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_stack(_edited(tmp_path, throughput_flags={"TORCHINDUCTOR_FREEZING": "1"}))
    assert caught.value.key == "throughput_flags"


def test_unknown_or_missing_keys_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_stack(_edited(tmp_path, surprise=1))
    assert caught.value.key == "surprise"
    with pytest.raises(InputError) as caught:
        parse_stack(b"[]", source="x.json")
    assert "JSON object" in str(caught.value)
