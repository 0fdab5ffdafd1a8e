"""Real GGUF files for the tests, written by the `gguf` package's own writer (llama.cpp's).

`write_gguf` lays down a small decoder's metadata and tensor table the way
`convert_hf_to_gguf.py` does, with tensors in the ggml types a quantized file mixes (F32 norms,
quantized matrices), so `read_gguf` reads what llama.cpp would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


@dataclass
class GgufShape:
    """What a test file holds; the figures a reader must give back."""

    architecture: str = "qwen2"
    layers: int = 3
    embedding: int = 128
    heads: int = 4
    kv_heads: int | list[int] = 2
    key_length: int | None = None
    value_length: int | None = None
    context: int = 4096
    chat_template: str | None = CHAT_TEMPLATE
    file_type: LlamaFileType = LlamaFileType.MOSTLY_Q8_0
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0
    extra: dict[str, int] = field(default_factory=dict)


def write_gguf(path: Path, shape: GgufShape) -> int:
    """Write the file; return the bytes of its tensors' data (what llama.cpp maps)."""
    writer = GGUFWriter(str(path), shape.architecture)
    arch = shape.architecture
    writer.add_name("test model")
    writer.add_file_type(shape.file_type)
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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return data_bytes
