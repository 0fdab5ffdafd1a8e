"""What a GGUF file says of itself: its metadata and tensor table, read with the `gguf` package.

A GGUF file carries everything llama.cpp needs in one file: the architecture, the figures of
the attention (layers, KV heads, key and value lengths), the context it was trained for, the
tokenizer with its chat template, and every tensor's quantization type and byte size. The
`gguf` package (llama.cpp's own reader, pinned to the runtime's source) memory-maps the file
and reads only the header and the tensor table; the weights are never read.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, Keys, LlamaFileType
from gguf.gguf_reader import ReaderField

from epycd.errors import InputError
from epycd.model.facts import GgufFile
from epycd.readfile import open_regular

MALFORMED = (ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error, MemoryError)


def read_gguf(path: Path, *, name: str | None = None) -> GgufFile:
    """The facts of the GGUF file at `path` (a regular file: a FIFO or device is refused);
    `name`: how the admin named it (a repository's file name), default the file's name."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise InputError(
            f"unreadable GGUF file: {exc.strerror or exc}",
            file=path,
            fix="give the absolute path of a .gguf file",
        ) from None
    try:
        size = os.fstat(fd).st_size
        reader = _reader(f"/proc/self/fd/{fd}", path)
        return _facts(reader, path, name or path.name, size)
    finally:
        os.close(fd)


def _reader(opened: str, path: Path) -> GGUFReader:
    """The reader over the descriptor already checked, so the file read is the one checked."""
    try:
        return GGUFReader(opened)
    except MALFORMED as exc:
        raise InputError(
            f"not a readable GGUF file ({type(exc).__name__}: {exc})",
            file=path,
            fix="give a complete .gguf file (llama.cpp's format, version 2 or 3)",
        ) from None


def _facts(reader: GGUFReader, path: Path, name: str, size: int) -> GgufFile:
    try:
        fields = _Fields(reader.fields)
        architecture = fields.text(Keys.General.ARCHITECTURE)
        if not architecture:
            raise InputError(
                "the GGUF file names no general.architecture", file=path, fix="reconvert it"
            )
        types = Counter(GGMLQuantizationType(int(t.tensor_type)).name for t in reader.tensors)
        arch = architecture
        return GgufFile(
            path=str(path),
            file=name,
            size_bytes=size,
            architecture=architecture,
            name=fields.text(Keys.General.NAME),
            file_type=_file_type(fields.integer(Keys.General.FILE_TYPE)),
            tensor_types=dict(types.most_common()),
            tensors_bytes=sum(int(t.n_bytes) for t in reader.tensors),
            context_length=fields.integer(Keys.LLM.CONTEXT_LENGTH.format(arch=arch)),
            block_count=fields.integer(Keys.LLM.BLOCK_COUNT.format(arch=arch)),
            embedding_length=fields.integer(Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)),
            head_count=fields.first_integer(Keys.Attention.HEAD_COUNT.format(arch=arch)),
            head_count_kv=fields.integers(Keys.Attention.HEAD_COUNT_KV.format(arch=arch)),
            key_length=fields.integer(Keys.Attention.KEY_LENGTH.format(arch=arch)),
            value_length=fields.integer(Keys.Attention.VALUE_LENGTH.format(arch=arch)),
            sliding_window=fields.integer(Keys.Attention.SLIDING_WINDOW.format(arch=arch)),
            feed_forward_length=fields.largest_integer(
                Keys.LLM.FEED_FORWARD_LENGTH.format(arch=arch)
            ),
            vocab_size=fields.array_length(Keys.Tokenizer.LIST)
            or fields.integer(Keys.LLM.VOCAB_SIZE.format(arch=arch)),
            repackable_bytes=_repackable_bytes(reader),
            chat_template=fields.text(Keys.Tokenizer.CHAT_TEMPLATE) is not None,
        )
    except MALFORMED as exc:
        raise InputError(
            f"unreadable GGUF metadata ({type(exc).__name__}: {exc})",
            file=path,
            fix="give a complete .gguf file (llama.cpp's format, version 2 or 3)",
        ) from None


TOKEN_EMBEDDINGS = "token_embd.weight"
"""Looked up by row (get_rows), never multiplied: llama.cpp keeps it where it is mapped."""
REPACK_ROWS = 8
"""The CPU backend repacks a matrix in blocks of 8 rows (ggml-cpu/repack.cpp on x86)."""


def _repackable_bytes(reader: GGUFReader) -> dict[str, int]:
    """Per ggml type, the bytes of the matrices llama.cpp's CPU backend may repack: every
    tensor of two or more dimensions but the token embeddings, whose second dimension (its
    rows, ggml's ne[1]) is a multiple of 8. Which types it repacks depends on the CPU
    (`epycd.model.llama_memory.repacked_bytes`)."""
    found: Counter[str] = Counter()
    for tensor in reader.tensors:
        shape = [int(n) for n in tensor.shape]
        if tensor.name == TOKEN_EMBEDDINGS or len(shape) < 2 or shape[1] % REPACK_ROWS:
            continue
        found[GGMLQuantizationType(int(tensor.tensor_type)).name] += int(tensor.n_bytes)
    return dict(found.most_common())


def _file_type(value: int | None) -> str | None:
    """llama.cpp's name of the file's quantization (`general.file_type`): Q4_K_M, BF16, ..."""
    if value is None:
        return None
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"unknown ({value})"


class _Fields:
    """Typed access to the reader's fields: a missing key or a value of another type is None."""

    def __init__(self, fields: dict[str, ReaderField]) -> None:
        self._fields = fields

    def _contents(self, key: str) -> Any:
        field = self._fields.get(key)
        return None if field is None else field.contents()

    def text(self, key: str) -> str | None:
        value = self._contents(key)
        return value if isinstance(value, str) else None

    def integer(self, key: str) -> int | None:
        value = self._contents(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def integers(self, key: str) -> list[int] | None:
        """A per-layer array, or one value for every layer (as a one-item list)."""
        value = self._contents(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            return [int(v) for v in value]
        return None

    def first_integer(self, key: str) -> int | None:
        values = self.integers(key)
        return values[0] if values else None

    def largest_integer(self, key: str) -> int | None:
        values = self.integers(key)
        return max(values) if values else None

    def array_length(self, key: str) -> int | None:
        """The number of items of an array field, without reading them."""
        field = self._fields.get(key)
        if field is None or field.types[:1] != [GGUFValueType.ARRAY]:
            return None
        return len(field.data)
