"""Tiny pooling models for the real servers, made from the tiny chat model's recipe
(tests/tools/tiny_model.py) at test time: no cache builder of their own.

- the embedder is the tiny model itself, which vLLM's pooling runner serves as an embedding
  model (`--runner pooling --convert embed`: last-token pooling, the hidden size wide);
- the reranker is the same transformer as a one-label `Qwen2ForSequenceClassification`, its
  `score` head seeded random, which vLLM serves on /v1/rerank and /v1/score.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from tests.health.realvllm import tiny_model, tiny_model_builder

EMBEDDING_FLAGS = ("--runner", "pooling", "--convert", "embed")
RERANK_FLAGS = ("--runner", "pooling")
SCORE_SEED = 20261205


def tiny_width() -> int:
    """The tiny model's hidden size: its embeddings' width."""
    return int(tiny_model_builder().TINY.hidden)


def build_tiny_reranker(out: Path) -> Path:
    """The tiny model with a one-label classification head, written into `out`."""
    builder = tiny_model_builder()
    source = tiny_model()
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, out / item.name)
    weights = builder.random_weights()
    rng = np.random.default_rng(SCORE_SEED)
    score = rng.normal(0.0, 0.02, size=(1, builder.TINY.hidden)).astype(np.float32)
    weights["score.weight"] = builder.to_bf16_bits(score)
    (out / "model.safetensors").unlink()
    builder.write_safetensors(out / "model.safetensors", weights, broken=False)
    config = json.loads((out / "config.json").read_text())
    config |= {
        "architectures": ["Qwen2ForSequenceClassification"],
        "num_labels": 1,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
