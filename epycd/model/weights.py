"""Weight bytes from safetensors metadata: a file's header, a sharded index, the hub's figures.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming
each tensor's dtype, shape and byte range; only the header is read, never the tensors. The
header is checked as the safetensors library checks it before a figure is taken from it: a
length within the cap and the file, a JSON object, each tensor a known dtype, a shape of
non-negative integers, two ordered offsets within the file that span exactly the shape's bytes,
the tensors tiling the data with no overlap, hole or trailing byte (a file cut short or padded
is refused here, not by the engine at load), `__metadata__` a map of strings. Anything else is
an `InputError` naming the file, the tensor and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from epycd.errors import InputError
from epycd.readfile import (
    MODEL_JSON_MAX_BYTES,
    SAFETENSORS_HEADER_MAX_BYTES,
    read_length_prefixed,
    read_text,
    size_text,
)

INDEX_SUFFIX = ".safetensors.index.json"
MAX_HEADER_BYTES = SAFETENSORS_HEADER_MAX_BYTES
METADATA_KEY = "__metadata__"
HEADER_FIX = (
    "the file is cut short, damaged or not a safetensors file: download the model again, or "
    "remove the file from the model folder"
)

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
SAFETENSORS_DTYPE_BITS = {name: 8 * size for name, size in SAFETENSORS_DTYPE_BYTES.items()} | {
    "C64": 64,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "F4": 4,
}
"""Every dtype the safetensors format names, in bits per element (F4 and F6 pack below a byte)."""


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    """Its byte range in the data after the header."""


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, Tensor]
    metadata: dict[str, str]

    @property
    def data_bytes(self) -> int:
        """The tensors' bytes: what loading the weights takes."""
        return sum(t.end - t.start for t in self.tensors.values())


def shown(key: str) -> str:
    """A tensor's name as an error shows it: quoted, escaped, at most 80 characters."""
    text = json.dumps(key)
    return text if len(text) <= 80 else text[:76] + '..."'


def _bad(path: Path, message: str, tensor: str | None = None) -> InputError:
    """The error for the file, naming the tensor in the message: the planner names the
    endpoint file's key (`model`) of the whole line."""
    said = message if tensor is None else f"tensor {shown(tensor)}: {message}"
    return InputError(said, file=path, fix=HEADER_FIX)


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _element_bits(shape: tuple[int, ...], bits: int, span: int) -> int:
    """The shape's bits, stopped once past `span` bytes (a shape of a million huge dimensions
    is not multiplied out)."""
    if 0 in shape:
        return 0
    total = bits
    for dimension in shape:
        total *= dimension
        if total > 8 * span:
            return total
    return total


def _tensor(path: Path, name: str, info: object, data_size: int) -> Tensor:
    if not isinstance(info, dict):
        raise _bad(path, "is not an object (dtype, shape, data_offsets)", name)
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        known = ", ".join(sorted(SAFETENSORS_DTYPE_BITS))
        raise _bad(path, f"dtype {shown(str(dtype))} is not a safetensors dtype ({known})", name)
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _bad(path, "shape must be a list of non-negative integers", name)
    if "data_offsets" not in info:
        raise _bad(path, "data_offsets is missing", name)
    offsets = info["data_offsets"]
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)):
        raise _bad(path, "data_offsets must be two non-negative integers [start, end]", name)
    start, end = offsets
    if end < start:
        raise _bad(path, f"data_offsets [{start}, {end}] end before they start", name)
    if end > data_size:
        raise _bad(
            path, f"data_offsets [{start}, {end}] end past the file (its data: {data_size} bytes)",
            name,
        )  # fmt: skip
    bits = _element_bits(tuple(shape), SAFETENSORS_DTYPE_BITS[dtype], end - start)
    if bits != 8 * (end - start):
        size = f"{bits // 8}" if bits % 8 == 0 else f"{bits / 8}"
        raise _bad(
            path, f"shape {shape} of {dtype} is {size} bytes, but data_offsets span {end - start}",
            name,
        )  # fmt: skip
    return Tensor(dtype=dtype, shape=tuple(shape), start=start, end=end)


def _metadata(path: Path, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _bad(path, f"{shown(METADATA_KEY)} must map strings to strings")
    return dict(value)


def _contiguous(path: Path, tensors: dict[str, Tensor], data_size: int) -> None:
    """The tensors tile the data exactly, as the safetensors library requires before it loads
    a file: no overlap, no hole between two, no byte after the last."""
    ordered = sorted(tensors.items(), key=lambda item: (item[1].start, item[1].end))
    covered, before = 0, None
    for name, tensor in ordered:
        if before is not None and tensor.start < covered:
            first_name, first = before
            raise _bad(
                path,
                f"data_offsets [{tensor.start}, {tensor.end}] overlap those of "
                f"{shown(first_name)} [{first.start}, {first.end}]",
                name,
            )
        if tensor.start > covered:
            raise _bad(
                path, f"data_offsets [{tensor.start}, {tensor.end}] leave bytes "
                f"[{covered}, {tensor.start}] before them that no tensor holds",
                name,
            )  # fmt: skip
        covered, before = tensor.end, (name, tensor)
    if covered != data_size:
        raise _bad(
            path, f"{data_size - covered} bytes after the last tensor that no tensor holds "
            f"(the tensors end at {covered}, the data at {data_size})",
        )  # fmt: skip


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """The header's bytes and the size of the data after it."""
    try:
        read = read_length_prefixed(path, MAX_HEADER_BYTES)
    except OSError as exc:
        raise InputError(
            f"unreadable safetensors file: {exc.strerror or exc}", file=path, fix=HEADER_FIX
        ) from None
    if read.said is None:
        raise _bad(path, "not a safetensors file (shorter than 8 bytes)")
    if read.said > MAX_HEADER_BYTES:
        raise _bad(
            path, f"its header length {read.said} is more than {size_text(MAX_HEADER_BYTES)}, "
            "more than a safetensors header holds",
        )  # fmt: skip
    if 8 + read.said > read.size or len(read.header) != read.said:
        raise _bad(
            path, f"its header length {read.said} runs past the end of the file "
            f"({read.size} bytes)",
        )  # fmt: skip
    return read.header, read.size - 8 - read.said


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """The checked header of a safetensors file (see the module docstring); a regular file
    only (a FIFO or device is refused, never waited on)."""
    raw, data_size = _header_bytes(path)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, f"its header is not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"its header is a JSON {type(header).__name__}, not a JSON object")
    metadata = _metadata(path, header.pop(METADATA_KEY, {}))
    tensors = {name: _tensor(path, name, info, data_size) for name, info in header.items()}
    _contiguous(path, tensors, data_size)
    return SafetensorsHeader(tensors=tensors, metadata=metadata)


def index_total_size(path: Path) -> int | None:
    """`metadata.total_size` of a sharded index, a positive integer; None when it has none
    (the shards' headers are read instead)."""
    try:
        index = json.loads(read_text(path, MODEL_JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return total if _is_count(total) and total > 0 else None


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
    return sum(read_safetensors_header(f).data_bytes for f in files), "safetensors-header"
