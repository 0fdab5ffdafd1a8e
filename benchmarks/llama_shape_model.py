"""A GGUF model of a real model's shape, with random weights, for llama.cpp's benchmarks.

Run:  .venv/bin/python benchmarks/llama_shape_model.py --source LLAMA_CPP_DIR --out FILE.gguf
          [--shape qwen2.5-0.5b]
(LLAMA_CPP_DIR: the pinned llama.cpp source, e.g. the sdist that packaging/llama-runtime.sh
keeps in DEST/.build/download, unpacked. Writes bf16; `DEST/bin/llama quantize FILE OUT Q8_0`
or `Q4_K_M` makes the quantized ones.)

The tests' tiny models have a 2048-token vocabulary, so llama-server's logits and compute
buffers (n_vocab x n_ubatch) are a few MiB where a real model's are hundreds. This file has a
real model's dimensions and its real tokenizer: the vocabulary, merges and chat template are
copied from the vocab-only GGUF the llama.cpp source ships for that tokenizer
(`models/ggml-vocab-qwen2.gguf`), the weights are seeded random bf16 (the text it writes is
noise; the memory and the speed are the real shape's). No hub is needed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import (
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
    PoolingType,
)


@dataclass(frozen=True)
class Shape:
    architecture: str
    vocab_file: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int
    rope_theta: float
    tied_embeddings: bool
    qkv_bias: bool = True
    """Qwen2's attention has biases on q, k and v; Llama's and Qwen3's have none."""
    qk_norm: bool = False
    """Qwen3 normalizes q and k per head (attn_q_norm, attn_k_norm)."""


SHAPES = {
    # Qwen/Qwen2.5-0.5B-Instruct's config.json
    "qwen2.5-0.5b": Shape("qwen2", "ggml-vocab-qwen2.gguf", 896, 24, 14, 2, 4864, 32768, 1e6, True),
    # Qwen/Qwen2.5-1.5B-Instruct's config.json
    "qwen2.5-1.5b": Shape(
        "qwen2", "ggml-vocab-qwen2.gguf", 1536, 28, 12, 2, 8960, 32768, 1e6, True
    ),
    # meta-llama/Llama-3.2-1B-Instruct's config.json (its vocabulary: the llama-bpe vocab file)
    "llama-3.2-1b": Shape(
        "llama", "ggml-vocab-llama-bpe.gguf", 2048, 16, 32, 8, 8192, 131072, 5e5, True, False
    ),
    # Qwen/Qwen3-0.6B's config.json (head_dim 128 with hidden 1024: written as key_length)
    "qwen3-0.6b": Shape(
        "qwen3", "ggml-vocab-qwen2.gguf", 1024, 28, 16, 8, 3072, 40960, 1e6, True, False, True
    ),
}
HEAD_DIM = {"qwen3-0.6b": 128}
"""Head sizes that are not hidden / heads."""
TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.chat_template",
)  # fmt: skip


def bf16(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Normal(0, 0.02) values as bf16 bit patterns (the top half of each float32)."""
    values = (rng.standard_normal(shape, dtype=np.float32) * 0.02).view(np.uint32)
    return (values >> 16).astype(np.uint16)


def copy_tokenizer(
    vocab: GGUFReader, writer: GGUFWriter, keys: tuple[str, ...] = TOKENIZER_KEYS
) -> int:
    """The vocab-only file's tokenizer `keys` into `writer`; returns the vocabulary size."""
    size = 0
    for key in keys:
        field = vocab.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        if field.types[0] == GGUFValueType.ARRAY:
            writer.add_array(key, value)
            size = max(size, len(value)) if key == "tokenizer.ggml.tokens" else size
        elif field.types[0] == GGUFValueType.STRING:
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, int(value))
    return size


def write(
    source: Path, shape: Shape, out: Path, seed: int = 0, head_dim: int | None = None
) -> None:
    vocab = GGUFReader(str(source / "models" / shape.vocab_file))
    writer = GGUFWriter(str(out), shape.architecture)
    writer.add_name(f"random {out.stem}")
    writer.add_file_type(LlamaFileType.MOSTLY_BF16)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-6)
    n_vocab = copy_tokenizer(vocab, writer)
    rng = np.random.default_rng(seed)
    head_dim = head_dim or shape.hidden // shape.heads
    if head_dim != shape.hidden // shape.heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    q_dim, kv_dim = shape.heads * head_dim, shape.kv_heads * head_dim
    raw = GGMLQuantizationType.BF16

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, bf16(rng, rows, cols), raw_dtype=raw)

    def vector(name: str, size: int, value: float | None = None) -> None:
        data = np.full(size, value, np.float32) if value is not None else np.zeros(size, np.float32)
        writer.add_tensor(name, data)

    matrix("token_embd.weight", n_vocab, shape.hidden)
    vector("output_norm.weight", shape.hidden, 1.0)
    if not shape.tied_embeddings:
        matrix("output.weight", n_vocab, shape.hidden)
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        vector(f"{block}.attn_norm.weight", shape.hidden, 1.0)
        matrix(f"{block}.attn_q.weight", q_dim, shape.hidden)
        matrix(f"{block}.attn_k.weight", kv_dim, shape.hidden)
        matrix(f"{block}.attn_v.weight", kv_dim, shape.hidden)
        if shape.qkv_bias:
            vector(f"{block}.attn_q.bias", q_dim)
            vector(f"{block}.attn_k.bias", kv_dim)
            vector(f"{block}.attn_v.bias", kv_dim)
        if shape.qk_norm:
            vector(f"{block}.attn_q_norm.weight", head_dim, 1.0)
            vector(f"{block}.attn_k_norm.weight", head_dim, 1.0)
        matrix(f"{block}.attn_output.weight", shape.hidden, q_dim)
        vector(f"{block}.ffn_norm.weight", shape.hidden, 1.0)
        matrix(f"{block}.ffn_gate.weight", shape.ffn, shape.hidden)
        matrix(f"{block}.ffn_up.weight", shape.ffn, shape.hidden)
        matrix(f"{block}.ffn_down.weight", shape.hidden, shape.ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@dataclass(frozen=True)
class EncoderShape:
    """A BERT encoder (llama.cpp's `bert` architecture, as its converter writes one): no KV
    cache, bidirectional attention, an ungated GELU FFN, layer norms with biases."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    context: int = 512
    pooling: int | None = 1
    """{arch}.pooling_type (1: mean); None with `classifier`, as a converted reranker."""
    classifier: bool = False
    """A one-output classifier head (cls.output): a cross-encoder reranker."""


BERT_VOCAB = "ggml-vocab-bert-bge.gguf"
BERT_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.cls_token_id", "tokenizer.ggml.mask_token_id",
    "tokenizer.ggml.token_type_count",
)  # fmt: skip


def write_encoder(source: Path, shape: EncoderShape, out: Path, seed: int = 0) -> None:
    """A BERT of `shape` with bge's WordPiece vocabulary and seeded random bf16 weights."""
    vocab = GGUFReader(str(source / "models" / BERT_VOCAB))
    writer = GGUFWriter(str(out), "bert")
    writer.add_name(f"random {out.stem}")
    writer.add_file_type(LlamaFileType.MOSTLY_BF16)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    if shape.pooling is not None:
        writer.add_pooling_type(PoolingType(shape.pooling))
    n_vocab = copy_tokenizer(vocab, writer, BERT_TOKENIZER_KEYS)
    rng = np.random.default_rng(seed)
    raw = GGMLQuantizationType.BF16

    def matrix(name: str, rows: int, cols: int) -> None:
        writer.add_tensor(name, bf16(rng, rows, cols), raw_dtype=raw)

    def vector(name: str, size: int, value: float = 0.0) -> None:
        writer.add_tensor(name, np.full(size, value, np.float32))

    def linear(name: str, rows: int, cols: int) -> None:
        matrix(f"{name}.weight", rows, cols)
        vector(f"{name}.bias", rows)

    def norm(name: str) -> None:
        vector(f"{name}.weight", shape.hidden, 1.0)
        vector(f"{name}.bias", shape.hidden)

    matrix("token_embd.weight", n_vocab, shape.hidden)
    writer.add_tensor("token_types.weight", np.zeros((2, shape.hidden), np.float32))
    writer.add_tensor(
        "position_embd.weight",
        (rng.standard_normal((shape.context, shape.hidden), dtype=np.float32) * 0.02),
    )
    norm("token_embd_norm")
    for layer in range(shape.layers):
        block = f"blk.{layer}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            linear(f"{block}.{name}", shape.hidden, shape.hidden)
        norm(f"{block}.attn_output_norm")
        linear(f"{block}.ffn_up", shape.ffn, shape.hidden)
        linear(f"{block}.ffn_down", shape.hidden, shape.ffn)
        norm(f"{block}.layer_output_norm")
    if shape.classifier:
        linear("cls.output", 1, shape.hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the llama.cpp source folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(args.source, SHAPES[args.shape], args.out, head_dim=HEAD_DIM.get(args.shape))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024**3:.2f} GiB, {args.shape})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
