"""Real GGUF files for the tests, written by the `gguf` package's own writer (llama.cpp's).

`write_gguf` lays down a small decoder's metadata and tensor table the way
`convert_hf_to_gguf.py` does, with tensors in the ggml types a quantized file mixes (F32 norms,
quantized matrices), so `read_gguf` reads what llama.cpp would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


@dataclass
class GgufShape:
    """What a test file holds; the figures a reader must give back."""

    architecture: str = "qwen2"
    name: str = "test model"
    """general.name."""
    layers: int = 3
    embedding: int = 128
    heads: int = 4
    kv_heads: int | list[int] = 2
    key_length: int | None = None
    value_length: int | None = None
    context: int | None = 4096
    """None: the file gives no context length ({arch}.context_length)."""
    chat_template: str | None = CHAT_TEMPLATE
    file_type: LlamaFileType = LlamaFileType.MOSTLY_Q8_0
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0
    extra: dict[str, int] = field(default_factory=dict)
    feed_forward: int | None = None
    vocab: int | None = None
    """The tokenizer's token list (tokenizer.ggml.tokens) of this many tokens."""
    matrices: dict[str, tuple[GGMLQuantizationType, int, int]] = field(default_factory=dict)
    """More tensors: name -> (type, rows, columns), their bytes random (never loaded)."""


def raw_matrix(kind: GGMLQuantizationType, rows: int, columns: int) -> np.ndarray:
    """A (rows, columns) matrix of `kind` as the bytes a file holds: rows x the bytes of
    columns / block size blocks."""
    block, type_size = GGML_QUANT_SIZES[kind]
    assert columns % block == 0, f"{kind.name} takes columns in blocks of {block}"
    return np.zeros((rows, columns // block * type_size), dtype=np.uint8)


def write_gguf(path: Path, shape: GgufShape) -> int:
    """Write the file; return the bytes of its tensors' data (what llama.cpp maps)."""
    writer = GGUFWriter(str(path), shape.architecture)
    arch = shape.architecture
    writer.add_name(shape.name)
    writer.add_file_type(shape.file_type)
    if shape.context is not None:
        writer.add_context_length(shape.context)
    writer.add_block_count(shape.layers)
    writer.add_embedding_length(shape.embedding)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    if shape.key_length is not None:
        writer.add_key_length(shape.key_length)
    if shape.value_length is not None:
        writer.add_value_length(shape.value_length)
    if shape.chat_template is not None:
        writer.add_chat_template(shape.chat_template)
    for key, value in shape.extra.items():
        writer.add_uint32(key.format(arch=arch), value)
    if shape.feed_forward is not None:
        writer.add_feed_forward_length(shape.feed_forward)
    if shape.vocab is not None:
        writer.add_token_list([f"t{i}" for i in range(shape.vocab)])
    rng = np.random.default_rng(0)
    data_bytes = 0
    for layer in range(shape.layers):
        norm = rng.standard_normal(shape.embedding).astype(np.float32)
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", norm)
        data_bytes += norm.nbytes
        matrix = rng.standard_normal((shape.embedding, shape.embedding)).astype(np.float32)
        packed = quantize(matrix, shape.matrix_type)
        writer.add_tensor(f"blk.{layer}.attn_q.weight", packed, raw_dtype=shape.matrix_type)
        data_bytes += packed.nbytes
    for name, (kind, rows, columns) in shape.matrices.items():
        raw = raw_matrix(kind, rows, columns)
        writer.add_tensor(name, raw, raw_dtype=kind)
        data_bytes += raw.nbytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return data_bytes
