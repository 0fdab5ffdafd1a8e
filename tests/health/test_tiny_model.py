"""The tiny test model's builder (tests/tools/tiny_model.py): no vLLM needed."""

from __future__ import annotations

from pathlib import Path

from tests.health.realvllm import build_tiny_model


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
