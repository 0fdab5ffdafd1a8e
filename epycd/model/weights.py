"""Weight bytes from safetensors metadata: a file's header, a sharded index, the hub's figures.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming
each tensor's dtype, shape and byte range; only the header is read, never the tensors.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from epycd.errors import InputError
from epycd.readfile import MODEL_JSON_MAX_BYTES, open_regular, read_text

INDEX_SUFFIX = ".safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024

SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: tensor name -> {dtype, shape, data_offsets};
    a regular file only (`open_regular`: a FIFO or device is refused, never waited on)."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise InputError(f"unreadable safetensors file: {exc.strerror or exc}", file=path) from None
    with open(fd, "rb") as handle:
        raw_length = handle.read(8)
        if len(raw_length) != 8:
            raise InputError("not a safetensors file (shorter than 8 bytes)", file=path)
        (length,) = struct.unpack("<Q", raw_length)
        if length > MAX_HEADER_BYTES:
            raise InputError(f"safetensors header of {length} bytes is not credible", file=path)
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"unreadable safetensors header: {exc}", file=path) from None
    if not isinstance(header, dict):
        raise InputError("safetensors header is not a JSON object", file=path)
    header.pop("__metadata__", None)
    return header


def tensor_bytes(header: dict[str, Any]) -> int:
    """Sum of the tensors' byte ranges (dtype size x elements each)."""
    return sum(
        int(info["data_offsets"][1]) - int(info["data_offsets"][0]) for info in header.values()
    )


def index_total_size(path: Path) -> int | None:
    try:
        index = json.loads(read_text(path, MODEL_JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    total = (index.get("metadata") or {}).get("total_size")
    return int(total) if isinstance(total, int | float) and total > 0 else None


def bytes_from_parameter_counts(parameters: Mapping[str, int]) -> int:
    """The hub's safetensors summary ({dtype: parameter count}) in bytes."""
    return sum(SAFETENSORS_DTYPE_BYTES.get(dtype, 2) * count for dtype, count in parameters.items())


def local_weights_bytes(folder: Path) -> tuple[int, str] | None:
    """(bytes, source) from a model folder or snapshot: an index first, else every file's header."""
    for index in sorted(folder.glob(f"*{INDEX_SUFFIX}")):
        total = index_total_size(index)
        if total:
            return total, "safetensors-index"
    files = sorted(p for p in folder.glob("*.safetensors") if p.exists())
    if not files:
        return None
    return sum(tensor_bytes(read_safetensors_header(f)) for f in files), "safetensors-header"
