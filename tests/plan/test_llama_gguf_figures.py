"""A llama.cpp endpoint whose GGUF file gives a figure out of range (a negative context, more
layers than llama.cpp loads) is refused at planning, naming the file and the key, instead of
planned with a negative or absurd size."""

from __future__ import annotations

import pytest

from tests.model import hostile_gguf as h
from tests.plan.test_llama_plan import LlamaWorkspace, lw  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("figures", "key"),
    [
        ({"context_length": -4096}, "qwen2.context_length"),
        ({"block_count": 2**63}, "qwen2.block_count"),
        ({"attention__head_count_kv": -2}, "qwen2.attention.head_count_kv"),
    ],
)
def test_a_figure_out_of_range_is_refused_naming_the_file_and_key(
    lw: LlamaWorkspace,  # noqa: F811
    figures: dict[str, int],
    key: str,
) -> None:
    lw.gguf.write_bytes(h.gguf(h.model_keys(**figures)))
    lw.endpoint("chat")
    result = lw.plan()["chat"]
    assert result.plan is None
    [error] = result.errors
    assert error.exit_code == 2 and error.key == key, error.text
    assert str(lw.gguf) in error.text and "out of range" in error.text, error.text
