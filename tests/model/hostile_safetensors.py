"""Hostile safetensors files, byte by byte: what the `safetensors` library will not write (an
offset missing, out of order or overlapping, a length past the file), laid out as its reader
reads them: an 8-byte little-endian header length, the JSON header, the tensors' bytes."""

from __future__ import annotations

import json
import struct
from typing import Any

TENSOR_BYTES = 64
"""The data after the header of each file here (a tensor of 32 BF16 values)."""


def tensor(
    start: int = 0, end: int = TENSOR_BYTES, dtype: str = "BF16", shape: Any = None
) -> dict[str, Any]:
    """One header entry; `shape` defaults to the span in elements of `dtype` (BF16: 2 bytes)."""
    return {"dtype": dtype, "shape": [(end - start) // 2] if shape is None else shape,
            "data_offsets": [start, end]}  # fmt: skip


def safetensors(header: Any, *, data: int = TENSOR_BYTES, length: int | None = None) -> bytes:
    """The file: `header` as JSON (bytes or a str as they are), `data` bytes of tensors;
    `length` overrides the header length the first 8 bytes say."""
    if isinstance(header, bytes | str):
        raw = header.encode() if isinstance(header, str) else header
    else:
        raw = json.dumps(header).encode()
    said = len(raw) if length is None else length
    return struct.pack("<Q", said) + raw + b"\0" * data


def good() -> bytes:
    return safetensors({"__metadata__": {"format": "pt"}, "w": tensor()})
