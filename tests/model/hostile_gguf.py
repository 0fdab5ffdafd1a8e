"""Hostile GGUF files, byte by byte: what `gguf.GGUFWriter` will not write (a count the file
cannot hold, arrays of arrays, a negative layer count), laid out as llama.cpp's gguf.cpp reads
them (little-endian, version 3)."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from gguf import GGUFValueType

ARCH = "qwen2"


def text(value: str | bytes) -> bytes:
    """A GGUF string: its length (u64), then its bytes."""
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, kind: GGUFValueType, payload: bytes) -> bytes:
    return text(key) + struct.pack("<I", kind) + payload


def number(key: str, kind: GGUFValueType, value: int) -> bytes:
    """One integer key of this type: u32, i32, u64 or i64."""
    formats = {
        GGUFValueType.UINT32: "<I",
        GGUFValueType.INT32: "<i",
        GGUFValueType.UINT64: "<Q",
        GGUFValueType.INT64: "<q",
    }
    return kv(key, kind, struct.pack(formats[kind], value))


def string(key: str, value: str) -> bytes:
    return kv(key, GGUFValueType.STRING, text(value))


def array(key: str, item: GGUFValueType, count: int, items: bytes = b"") -> bytes:
    """An array header saying `count` items of `item`, then `items` (as many as the test
    gives, which may be fewer)."""
    return kv(key, GGUFValueType.ARRAY, struct.pack("<IQ", item, count) + items)


def nested_arrays(key: str, depth: int) -> bytes:
    """An array of one array of one array ... `depth` deep, of one u8 at the bottom."""
    inner = struct.pack("<IQ", GGUFValueType.UINT8, 1) + b"\x01"
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", GGUFValueType.ARRAY, 1) + inner
    return kv(key, GGUFValueType.ARRAY, inner)


def model_keys(**figures: int) -> list[bytes]:
    """A small decoder's metadata; `figures` (context_length=-1, block_count=2**63...) replace
    the defaults, each written as an i64 so any value fits."""
    values = {
        "context_length": 4096,
        "block_count": 2,
        "embedding_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
    }
    values.update({name.replace("__", "."): value for name, value in figures.items()})
    keys = [string("general.architecture", ARCH)]
    for name, value in values.items():
        kind = GGUFValueType.INT64 if value < 0 else GGUFValueType.UINT64
        keys.append(number(f"{ARCH}.{name}", kind, value))
    return keys


def gguf(
    keys: Iterable[bytes],
    *,
    tensors: Iterable[bytes] = (),
    kv_count: int | None = None,
    tensor_count: int | None = None,
) -> bytes:
    """The header (magic, version 3, the counts: the true ones unless given) and the keys."""
    keys, tensors = list(keys), list(tensors)
    header = b"GGUF" + struct.pack(
        "<IQQ",
        3,
        len(tensors) if tensor_count is None else tensor_count,
        len(keys) if kv_count is None else kv_count,
    )
    return header + b"".join(keys) + b"".join(tensors)


def tensor_info(name: str, dims: list[int], kind: int, offset: int = 0) -> bytes:
    """One entry of the tensor table: name, dimensions (ne, as i64), ggml type, data offset."""
    return (
        text(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}q", *dims)
        + struct.pack("<IQ", kind, offset)
    )
