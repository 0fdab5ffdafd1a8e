"""The tiny test model's builder (tests/tools/tiny_model.py): no vLLM needed."""

from __future__ import annotations

from pathlib import Path

from tests.health.realvllm import build_tiny_model, tiny_model_builder


def test_variants_differ_only_where_they_should(tmp_path: Path) -> None:
    """Deterministic builds; the variants change the template or the weights' header only."""
    default = build_tiny_model(tmp_path / "a")
    again = build_tiny_model(tmp_path / "b")
    bare = build_tiny_model(tmp_path / "c", chat_template=False)
    broken = build_tiny_model(tmp_path / "d", broken_weights=True)
    names = sorted(p.name for p in default.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (default / name).read_bytes() == (again / name).read_bytes(), name
    assert "chat_template" in (default / "tokenizer_config.json").read_text()
    assert "chat_template" not in (bare / "tokenizer_config.json").read_text()
    weights = (default / "model.safetensors").read_bytes()
    assert (bare / "model.safetensors").read_bytes() == weights
    assert (broken / "model.safetensors").read_bytes() != weights
    assert len((broken / "model.safetensors").read_bytes()) == len(weights)
    assert 1.0e6 < sum(p.stat().st_size for p in default.iterdir()) < 1.6e6


def test_the_benchmark_size_is_about_a_hundred_million_parameters(tmp_path: Path) -> None:
    """benchmarks/serving.py needs a model where matrix work shows; its config and its
    weights must agree, or vLLM would refuse it at load."""
    builder = tiny_model_builder()
    small = builder.SHAPES["small"]
    assert 90e6 < small.parameters() < 115e6
    assert builder.SHAPES["tiny"].parameters() < 1e6
    config = builder.config(small)
    shapes = builder.tensor_shapes(small)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (
        config["num_key_value_heads"] * config["head_dim"],
        config["hidden_size"],
    )
    assert (
        len({k for k in shapes if k.endswith("mlp.up_proj.weight")}) == config["num_hidden_layers"]
    )
    assert builder.recipe_stamp(small) != builder.recipe_stamp()
