"""What a GGUF file says of itself: its metadata and tensor table, read within bounds.

A GGUF file carries everything llama.cpp needs in one file: the architecture, the figures of
the attention (layers, KV heads, key and value lengths), the context it was trained for, the
tokenizer with its chat template, and every tensor's quantization type and byte size. It is read
here as llama.cpp's own `ggml/src/gguf.cpp` reads it, with the `gguf` package's constants (value
and tensor types, block sizes, key names; the package pinned to the runtime's source), but not
its `GGUFReader`: that reader trusts the counts a file gives (an array longer than the file
loops on empty reads and grows without end, arrays of arrays recurse until Python gives up).

A file is hostile until read: every count, length and offset is checked against the bytes left
in the file and against llama.cpp's own limits before it is used, and only the header and the
tensor table are read, through one window of the file (the weights never). So whatever a file
says, a read ends in about a second, holds at most a window plus the kept values, and a bad
file is one `GgufError` (exit 2) naming it and what is wrong. The figures the plan sizes with
(layers, heads, context) are held to sane ranges too.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
    LlamaFileType,
    PoolingType,
)

from epycd.errors import InputError
from epycd.model.facts import GgufFile
from epycd.readfile import open_regular

FIX = "give a complete .gguf file (llama.cpp's format, version 2 or 3)"
RECONVERT = "the file's metadata is wrong: convert the model again with llama.cpp"
VERSIONS = (2, 3)
"""The GGUF versions llama.cpp reads (version 1 it refuses)."""
MAX_KEYS = 1 << 16
"""Metadata keys in one file: a real file has tens."""
MAX_TENSORS = 1 << 16
"""Tensors in one file: the largest published models have a few thousand."""
MAX_KEY_BYTES = 1 << 16
MAX_TENSOR_NAME_BYTES = 63
"""llama.cpp's GGML_MAX_NAME (64) with its terminating zero."""
MAX_DIMS = 4
"""llama.cpp's GGML_MAX_DIMS."""
MAX_LAYERS = 512
"""llama.cpp's LLAMA_MAX_LAYERS: the most layers it loads, and the longest per-layer array."""
MAX_STRINGS = 1 << 21
"""The strings of arrays one read walks (each skipped, not kept): a 262,144-token vocabulary
and its merges are a quarter of it, and the bound keeps a read of any file to about a second."""
MAX_TEXT_BYTES = 1 << 20
"""A string value longer than this is skipped, not read: a chat template is kilobytes."""
KEPT_TEXT_BYTES = 1 << 24
"""The string values one read keeps in all; later ones are skipped, not read."""
KEEP_ITEMS = 1 << 12
"""A numeric array of at most this many items is kept (per-layer figures); longer ones
(token scores and types) are skipped."""
KEPT_ITEMS = 1 << 16
"""The numbers of arrays one read keeps in all; later arrays are skipped."""
WINDOW = 1 << 20
"""The bytes read at once: what a read holds of the file."""
DEFAULT_ALIGNMENT = 32
INT64_MAX = (1 << 63) - 1
KEY_MIN_BYTES = 8 + 4 + 1
"""The smallest key: an empty name, its type, a one-byte value (a count's lower bound)."""
TENSOR_MIN_BYTES = 8 + 4 + 4 + 8
"""The smallest tensor entry: an empty name, no dimensions, its type and its offset."""
STRING = GGUFValueType.STRING
ARRAY = GGUFValueType.ARRAY
SCALARS: dict[GGUFValueType, struct.Struct] = {
    kind: struct.Struct(f"<{code}")
    for kind, code in (
        (GGUFValueType.UINT8, "B"),
        (GGUFValueType.INT8, "b"),
        (GGUFValueType.UINT16, "H"),
        (GGUFValueType.INT16, "h"),
        (GGUFValueType.UINT32, "I"),
        (GGUFValueType.INT32, "i"),
        (GGUFValueType.FLOAT32, "f"),
        (GGUFValueType.BOOL, "?"),
        (GGUFValueType.UINT64, "Q"),
        (GGUFValueType.INT64, "q"),
        (GGUFValueType.FLOAT64, "d"),
    )
}
"""Each fixed-size value type's layout: GGUF is little-endian (llama.cpp refuses the other)."""
U32, U64 = SCALARS[GGUFValueType.UINT32], SCALARS[GGUFValueType.UINT64]

Scalar = int | float | bool


class GgufError(InputError):
    """A file that is not a GGUF file llama.cpp could load, or that gives a figure out of
    range: exit 2, one line naming the file (and the key) and what is wrong."""


class _Malformed(Exception):
    """Raised inside the reader, which does not know the file's name; `read_gguf` names it."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


class Figure(NamedTuple):
    lowest: int
    highest: int
    meaning: str


FIGURES: dict[str, Figure] = {
    "context_length": Figure(1, 1 << 27, "tokens of context"),
    "block_count": Figure(1, MAX_LAYERS, "layers (llama.cpp loads at most 512)"),
    "embedding_length": Figure(1, 1 << 20, "the hidden size"),
    "head_count": Figure(0, 1 << 16, "attention heads"),
    "head_count_kv": Figure(0, 1 << 16, "KV heads"),
    "key_length": Figure(0, 1 << 16, "the key head length"),
    "value_length": Figure(0, 1 << 16, "the value head length"),
    "sliding_window": Figure(0, 1 << 27, "tokens of the sliding window"),
    "feed_forward_length": Figure(0, 1 << 22, "the FFN's width"),
    "vocab_size": Figure(1, MAX_STRINGS, "tokens of the vocabulary"),
}
"""The figures the plan sizes with (`GgufFile`'s fields) and what a file may give for each:
the widest real models are well inside, and a value outside would make a negative or absurd
plan (or an overflow) downstream."""


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
        contents = _parse(_Cursor(fd, size))
        return _facts(contents, path, name or path.name, size)
    except _Malformed as exc:
        if exc.key is None:
            raise GgufError(
                f"not a readable GGUF file: {exc.message}", file=path, fix=FIX
            ) from None
        raise GgufError(exc.message, file=path, key=exc.key, fix=RECONVERT) from None
    except OSError as exc:
        raise GgufError(
            f"unreadable GGUF file: {exc.strerror or exc}", file=path, fix=FIX
        ) from None
    finally:
        os.close(fd)


class _Cursor:
    """The file read front to back through one window of it: each read is checked against the
    bytes left in the file before anything is read or allocated, so no count or length the
    file gives can make a read run past its end, loop on nothing, or hold more than a window."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.pos = 0
        self.strings_left = MAX_STRINGS
        self.text_left = KEPT_TEXT_BYTES
        self.items_left = KEPT_ITEMS
        self._window = b""
        self._start = 0

    def left(self) -> int:
        return self.size - self.pos

    def need(self, length: int, what: str) -> None:
        if length > self.left():
            raise _Malformed(
                f"{what} at byte {self.pos} needs {length} bytes, and the file ends "
                f"{self.left()} bytes on (truncated?)"
            )

    def _at(self, length: int, what: str) -> int:
        """Where the next `length` bytes are in the window, read in if they are not."""
        self.need(length, what)
        at = self.pos - self._start
        if at < 0 or at + length > len(self._window):
            self._window = os.pread(self.fd, max(length, WINDOW), self.pos)
            self._start, at = self.pos, 0
            if len(self._window) < length:
                raise _Malformed(f"{what} at byte {self.pos}: the file got shorter while read")
        self.pos += length
        return at

    def take(self, length: int, what: str) -> bytes:
        at = self._at(length, what)
        return self._window[at : at + length]

    def skip(self, length: int, what: str) -> None:
        self.need(length, what)
        self.pos += length

    def unpack(self, layout: struct.Struct, what: str) -> Scalar:
        at = self._at(layout.size, what)  # first: it may move the window
        value: Scalar = layout.unpack_from(self._window, at)[0]
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack(U32, what))

    def u64(self, what: str) -> int:
        return int(self.unpack(U64, what))

    def skip_strings(self, count: int, what: str) -> None:
        """Walk `count` strings without keeping them, within the read's budget of strings."""
        if count > self.strings_left:
            raise _Malformed(
                f"{what}: {count} strings, more than a GGUF file holds ({MAX_STRINGS})"
            )
        self.strings_left -= count
        self.need(count * U64.size, what)
        for _ in range(count):
            self.skip(self.u64(what), what)


@dataclass(frozen=True)
class _Array:
    """An array value: its item type, its length, and its items where kept (few numbers)."""

    item: GGUFValueType
    count: int
    items: tuple[Scalar, ...] | None


@dataclass(frozen=True)
class _Unread:
    """A string value too long to keep (`MAX_TEXT_BYTES`, `KEPT_TEXT_BYTES`): only its
    length is known."""

    length: int


Value = Scalar | str | _Array | _Unread


@dataclass(frozen=True)
class _Tensor:
    name: str
    kind: GGMLQuantizationType
    shape: tuple[int, ...]
    """Its dimensions as the file gives them: ggml's ne, ne[0] (a row's length) first."""
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class _Contents:
    fields: dict[str, Value]
    tensors: list[_Tensor]


def _parse(cursor: _Cursor) -> _Contents:
    """The header, every key and the tensor table, checked as llama.cpp checks them."""
    if cursor.take(4, "the magic number") != b"GGUF":
        raise _Malformed("it does not start with GGUF")
    version = cursor.u32("the version")
    if version & 0xFFFF == 0 and version:
        raise _Malformed("it was written big-endian, which llama.cpp on x86 does not load")
    if version not in VERSIONS:
        raise _Malformed(f"version {version}: llama.cpp reads versions 2 and 3")
    tensor_count = cursor.u64("the tensor count")
    key_count = cursor.u64("the key count")
    _count(cursor, tensor_count, "tensors", MAX_TENSORS, TENSOR_MIN_BYTES)
    _count(cursor, key_count, "metadata keys", MAX_KEYS, KEY_MIN_BYTES)
    fields: dict[str, Value] = {}
    for _ in range(key_count):
        key = _key(cursor)
        if key in fields:
            raise _Malformed(f"the key {_shown(key)} is given twice")
        fields[key] = _value(cursor, key)
    tensors = [_tensor(cursor, index) for index in range(tensor_count)]
    _check_data(cursor, fields, tensors)
    return _Contents(fields, tensors)


def _count(cursor: _Cursor, count: int, what: str, most: int, least_bytes: int) -> None:
    """A count the file gives, against llama.cpp's files and the bytes left to hold it."""
    if count > most:
        raise _Malformed(f"{count} {what}, more than a GGUF file holds ({most})")
    if count * least_bytes > cursor.left():
        raise _Malformed(
            f"{count} {what} cannot fit in the {cursor.left()} bytes left of the file (truncated?)"
        )


def _shown(text: str) -> str:
    """A name from the file as a message shows it: quoted, escaped, short."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"{what} is not UTF-8 text") from None


def _key(cursor: _Cursor) -> str:
    length = cursor.u64("a key's length")
    if length > MAX_KEY_BYTES:
        raise _Malformed(f"a key of {length} bytes at byte {cursor.pos}")
    return _utf8(cursor.take(length, "a key"), f"the key at byte {cursor.pos - length}")


def _value_type(raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise _Malformed(f"{_shown(key)} has an unknown value type ({raw})") from None


def _value(cursor: _Cursor, key: str) -> Value:
    what = _shown(key)
    kind = _value_type(cursor.u32(what), key)
    if kind == STRING:
        return _text(cursor, what)
    if kind == ARRAY:
        return _array(cursor, key)
    return cursor.unpack(SCALARS[kind], what)


def _text(cursor: _Cursor, what: str) -> str | _Unread:
    length = cursor.u64(what)
    if length > min(MAX_TEXT_BYTES, cursor.text_left):
        cursor.skip(length, what)
        return _Unread(length)
    cursor.text_left -= length
    return _utf8(cursor.take(length, what), what)


def _array(cursor: _Cursor, key: str) -> _Array:
    """An array of strings is walked and of numbers skipped, each only as far as the file
    holds it; an array of arrays llama.cpp refuses, so is it here (nothing nests)."""
    what = _shown(key)
    item = _value_type(cursor.u32(what), key)
    count = cursor.u64(what)
    if item == ARRAY:
        raise _Malformed(f"{what} is an array of arrays, which llama.cpp does not load")
    if item == STRING:
        cursor.skip_strings(count, what)
        return _Array(item, count, None)
    layout = SCALARS[item]
    cursor.need(count * layout.size, f"{what} ({count} items of {item.name})")
    if count > min(KEEP_ITEMS, cursor.items_left):
        cursor.skip(count * layout.size, what)
        return _Array(item, count, None)
    cursor.items_left -= count
    return _Array(item, count, tuple(cursor.unpack(layout, what) for _ in range(count)))


def _tensor(cursor: _Cursor, index: int) -> _Tensor:
    """One entry of the tensor table, held to llama.cpp's checks of it."""
    what = f"tensor {index}"
    length = cursor.u64(what)
    if length > MAX_TENSOR_NAME_BYTES:
        raise _Malformed(f"{what} has a name of {length} bytes (llama.cpp takes 63 at most)")
    name = _utf8(cursor.take(length, what), f"the name of {what}")
    what = f"tensor {_shown(name)}"
    dims = cursor.u32(what)
    if dims > MAX_DIMS:
        raise _Malformed(f"{what} has {dims} dimensions (llama.cpp takes {MAX_DIMS} at most)")
    signed = SCALARS[GGUFValueType.INT64]
    shape = tuple(int(cursor.unpack(signed, what)) for _ in range(dims))
    if any(n < 0 for n in shape) or math.prod(shape) > INT64_MAX:
        raise _Malformed(f"{what} has the impossible shape {list(shape)}")
    raw = cursor.u32(what)
    try:
        kind = GGMLQuantizationType(raw)
        block, type_size = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise _Malformed(f"{what} has an unknown ggml type ({raw})") from None
    row = shape[0] if shape else 1
    if row % block:
        raise _Malformed(f"{what} has rows of {row}, not whole {kind.name} blocks of {block}")
    n_bytes = math.prod(shape) * type_size // block
    return _Tensor(name, kind, shape, n_bytes, cursor.u64(what))


def _check_data(cursor: _Cursor, fields: dict[str, Value], tensors: list[_Tensor]) -> None:
    """Each tensor's data lies inside the file (a download cut short is refused here), and
    no name is given twice."""
    alignment = _alignment(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.pos // alignment) * alignment
    names: set[str] = set()
    total = 0
    for tensor in tensors:
        if tensor.name in names:
            raise _Malformed(f"the tensor {_shown(tensor.name)} is given twice")
        names.add(tensor.name)
        end = start + tensor.offset + tensor.n_bytes
        if end > cursor.size:
            raise _Malformed(
                f"the data of tensor {_shown(tensor.name)} ends at byte {end}, past the file's end "
                f"at {cursor.size} (truncated?)"
            )
        total += tensor.n_bytes
    if total > cursor.size:
        raise _Malformed(f"the tensors claim {total} bytes, more than the file's {cursor.size}")


def _alignment(value: Value) -> int:
    """Where the tensors' data starts: a multiple of this (`general.alignment`)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
        raise _Malformed(f"general.alignment {value!r} is not a power of two")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _facts(contents: _Contents, path: Path, name: str, size: int) -> GgufFile:
    fields = _Fields(contents.fields)
    architecture = fields.text(Keys.General.ARCHITECTURE)
    if not architecture:
        raise GgufError(
            "the GGUF file names no general.architecture", file=path, fix="reconvert it"
        )
    arch = architecture
    types = Counter(tensor.kind.name for tensor in contents.tensors)
    return GgufFile(
        path=str(path),
        file=name,
        size_bytes=size,
        architecture=architecture,
        name=fields.text(Keys.General.NAME),
        file_type=_file_type(fields.integer(Keys.General.FILE_TYPE)),
        tensor_types=dict(types.most_common()),
        tensors_bytes=sum(tensor.n_bytes for tensor in contents.tensors),
        context_length=fields.figure("context_length", Keys.LLM.CONTEXT_LENGTH.format(arch=arch)),
        block_count=fields.figure("block_count", Keys.LLM.BLOCK_COUNT.format(arch=arch)),
        embedding_length=fields.figure(
            "embedding_length", Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)
        ),
        head_count=_first(
            fields.figures("head_count", Keys.Attention.HEAD_COUNT.format(arch=arch))
        ),
        head_count_kv=fields.figures(
            "head_count_kv", Keys.Attention.HEAD_COUNT_KV.format(arch=arch)
        ),
        key_length=fields.figure("key_length", Keys.Attention.KEY_LENGTH.format(arch=arch)),
        value_length=fields.figure("value_length", Keys.Attention.VALUE_LENGTH.format(arch=arch)),
        sliding_window=fields.figure(
            "sliding_window", Keys.Attention.SLIDING_WINDOW.format(arch=arch)
        ),
        feed_forward_length=_largest(
            fields.figures("feed_forward_length", Keys.LLM.FEED_FORWARD_LENGTH.format(arch=arch))
        ),
        vocab_size=fields.vocab_size(Keys.Tokenizer.LIST, Keys.LLM.VOCAB_SIZE.format(arch=arch)),
        repackable_bytes=_repackable_bytes(contents.tensors),
        chat_template=fields.has_text(Keys.Tokenizer.CHAT_TEMPLATE),
        pooling_type=_pooling_type(fields.integer(Keys.LLM.POOLING_TYPE.format(arch=arch))),
        classifier_outputs=_classifier_outputs(contents.tensors),
    )


CLASSIFIER_HEAD = "cls.output.weight"
"""A sequence classifier's output matrix as llama.cpp's converter names it (LLM_TENSOR_CLS_OUT)."""


def _classifier_outputs(tensors: list[_Tensor]) -> int | None:
    """The outputs of the classifier head (its matrix's second dimension), or None."""
    head = next((tensor for tensor in tensors if tensor.name == CLASSIFIER_HEAD), None)
    if head is None:
        return None
    return head.shape[1] if len(head.shape) > 1 else 1


def _pooling_type(value: int | None) -> str | None:
    """llama.cpp's name of a pooling type (`enum llama_pooling_type`); None for a value it
    does not know."""
    try:
        return PoolingType(value).name.lower() if value is not None else None
    except ValueError:
        return None


def _first(values: list[int] | None) -> int | None:
    return values[0] if values else None


def _largest(values: list[int] | None) -> int | None:
    return max(values) if values else None


TOKEN_EMBEDDINGS = "token_embd.weight"
"""Looked up by row (get_rows), never multiplied: llama.cpp keeps it where it is mapped."""
REPACK_ROWS = 8
"""The CPU backend repacks a matrix in blocks of 8 rows (ggml-cpu/repack.cpp on x86)."""


def _repackable_bytes(tensors: list[_Tensor]) -> dict[str, int]:
    """Per ggml type, the bytes of the matrices llama.cpp's CPU backend may repack: every
    tensor of two or more dimensions but the token embeddings, whose second dimension (its
    rows, ggml's ne[1]) is a multiple of 8. Which types it repacks depends on the CPU
    (`epycd.engines.llama_cpp.model.memory.repacked_bytes`)."""
    found: Counter[str] = Counter()
    for tensor in tensors:
        shape = tensor.shape
        if tensor.name == TOKEN_EMBEDDINGS or len(shape) < 2 or shape[1] % REPACK_ROWS:
            continue
        found[tensor.kind.name] += tensor.n_bytes
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
    """Typed access to the metadata: a missing key or a value of another type is None; a
    figure the plan sizes with is held to its range (`FIGURES`)."""

    def __init__(self, fields: dict[str, Value]) -> None:
        self._fields = fields

    def text(self, key: str) -> str | None:
        value = self._fields.get(key)
        return value if isinstance(value, str) else None

    def has_text(self, key: str) -> bool:
        return isinstance(self._fields.get(key), str | _Unread)

    def integer(self, key: str) -> int | None:
        value = self._fields.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def figure(self, field: str, key: str) -> int | None:
        value = self.integer(key)
        return None if value is None else _within(field, key, value)

    def figures(self, field: str, key: str) -> list[int] | None:
        """A per-layer array (at most one item a layer), or one value for every layer (as a
        one-item list); each held to the field's range."""
        value = self._fields.get(key)
        single = self.integer(key)
        if single is not None:
            return [_within(field, key, single)]
        if not isinstance(value, _Array):
            return None
        if value.count > MAX_LAYERS:
            raise _Malformed(f"{value.count} items, more than {MAX_LAYERS} layers", key=key)
        items = value.items or ()
        if not items or not all(_is_int(item) for item in items):
            return None
        return [_within(field, key, int(item)) for item in items]

    def vocab_size(self, tokens_key: str, size_key: str) -> int | None:
        """The tokenizer's token list's length, without reading it, else the size key."""
        tokens = self._fields.get(tokens_key)
        if isinstance(tokens, _Array) and tokens.count:
            return _within("vocab_size", tokens_key, tokens.count)
        return self.figure("vocab_size", size_key)


def _within(field: str, key: str, value: int) -> int:
    """The value, when it is in the field's range; a figure out of range is refused."""
    lowest, highest, meaning = FIGURES[field]
    if not lowest <= value <= highest:
        raise _Malformed(f"{value} is out of range: {lowest} to {highest} {meaning}", key=key)
    return value
