"""The one way the product reads a file a person or another process can point at.

An endpoint's key, token and chat template, the endpoint files, approval records, install
journals, status files, stop markers, bench results, epycd.conf, the probe cache and a
model's small files may each be a FIFO, a device (/dev/zero), a symlink to one, a folder or
huge. `read_bytes` never blocks on one and never reads more than its cap: it opens with
O_NONBLOCK (a FIFO with no writer opens at once), refuses what the open descriptor says is
not a regular file (a symlink is followed; what it points at must be a regular file), and
reads at most `cap` + 1 bytes, refusing a file over the cap.

Its refusal is a `RefusedFile`, an `OSError` naming the file and what it is, so a caller
that already turns an `OSError` into an error naming its file and key (or into "absent")
keeps doing so. `read_secret` adds ssh's rule for a key or token file (`secret_problem`).
`read_json_object` and `read_model` are the typed readers on top: a JSON object, or a file a
pydantic model validates, with an `InputError` naming the file, the key and the fix for content
that is not what it should be.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from epycd.errors import InputError, validation_error

if TYPE_CHECKING:  # pydantic is not imported by the light commands that import this
    from pydantic import BaseModel

    M = TypeVar("M", bound=BaseModel)

KIB = 1024
MIB = 1024 * KIB

SECRET_MAX_BYTES = 8 * KIB
"""An API key or HF token file: one key of at most 4096 characters and a newline."""
TEMPLATE_MAX_BYTES = 1 * MIB
"""A Jinja chat template (the largest shipped ones are tens of KiB)."""
RECORD_MAX_BYTES = 8 * MIB
"""An approval record or install journal (an approved plan and its units: tens of KiB)."""
STATE_MAX_BYTES = 1 * MIB
"""A supervisor status file, a stop marker, a bench result, epycd.conf."""
CACHE_MAX_BYTES = 8 * MIB
"""The probe cache (a few KiB per probed vLLM)."""
MODEL_JSON_MAX_BYTES = 64 * MIB
"""A model's config.json, tokenizer_config.json, chat_template.json or safetensors index
(a tokenizer_config.json with a large vocabulary's added tokens reaches a few MiB)."""
TABLE_MAX_BYTES = 8 * MIB
"""A data table: the shipped data/*.json (a few KiB each) or one an admin gives in its place
(an Instinct recipes cache, a stack file)."""
PROC_MAX_BYTES = 4 * MIB
"""A /proc file: a process's cgroup, comm or cmdline, or the mount table."""
FOREIGN_RECORD_MAX_BYTES = 8 * MIB
"""Another program's small record: docker's config.v2.json of a container, a venv's
pyvenv.cfg."""
TOOL_OUTPUT_MAX_BYTES = 64 * MIB
"""A result file `vllm bench` writes (per-request lengths, latencies and texts)."""
SAFETENSORS_HEADER_MAX_BYTES = 100 * MIB
"""A safetensors file's JSON header (the safetensors library's own limit is 100 MB)."""

KINDS = (
    (stat.S_ISDIR, "a folder", errno.EISDIR),
    (stat.S_ISFIFO, "a FIFO (named pipe)", errno.EINVAL),
    (stat.S_ISCHR, "a character device", errno.EINVAL),
    (stat.S_ISBLK, "a block device", errno.EINVAL),
    (stat.S_ISSOCK, "a socket", errno.EINVAL),
)


class RefusedFile(OSError):
    """A file the product will not read: not a regular file, over its cap, or (a secret) not
    root's alone. `strerror` says why; `filename` is the path as given; `fix`, when set, is
    what makes it acceptable."""

    fix: str | None = None


def kind_of(mode: int) -> tuple[str, int] | None:
    """What a non-regular file is (and the errno that says so); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, name, code in KINDS:
        if test(mode):
            return name, code
    return "not a regular file", errno.EINVAL


def size_text(cap: int) -> str:
    return f"{cap // MIB} MiB" if cap >= MIB and cap % MIB == 0 else f"{cap // KIB} KiB"


def _refuse_kind(path: Path | str, mode: int) -> None:
    found = kind_of(mode)
    if found is not None:
        name, code = found
        raise RefusedFile(code, f"is {name}, not a regular file; not read", str(path))


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of the regular file at `path` (symlinks followed), opened
    without blocking; a `RefusedFile` for anything else. The caller closes it."""
    _refuse_kind(path, os.stat(path).st_mode)  # do not even open a device
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        _refuse_kind(path, os.fstat(fd).st_mode)  # what was opened, not what was named
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int, path: Path | str, cap: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= cap:
        chunk = os.read(fd, min(cap + 1 - size, MIB))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > cap:
        raise RefusedFile(
            errno.EFBIG, f"is larger than {size_text(cap)}, more than it ever needs; not read",
            str(path),
        )  # fmt: skip
    return b"".join(chunks)


def read_bytes(path: Path | str, cap: int) -> bytes:
    """The whole of the regular file `path`, at most `cap` bytes (see the module docstring).
    `FileNotFoundError`, `PermissionError` and the like come through as they are."""
    fd = open_regular(path)
    try:
        return _read_fd(fd, path, cap)
    finally:
        os.close(fd)


def read_text(path: Path | str, cap: int, *, errors: str = "strict") -> str:
    """`read_bytes` as UTF-8 text (a `UnicodeDecodeError` unless `errors` says otherwise)."""
    return read_bytes(path, cap).decode("utf-8", errors=errors)


def _read_upto(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < count:
        chunk = os.read(fd, min(count - size, MIB))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class LengthPrefixed:
    """The start of a file that begins with its header's length (8 bytes, little-endian)."""

    size: int
    """The file's size in bytes, as the open file says."""
    said: int | None
    """The header length its first 8 bytes say; None for a file shorter than 8 bytes."""
    header: bytes
    """The header: the `said` bytes after the length, when within the cap and the file (the
    reader checks `len(header) == said`); else b"", nothing read."""


def read_length_prefixed(path: Path | str, cap: int) -> LengthPrefixed:
    """The header of a regular file laid out as a safetensors file is (`read_bytes`'s rules):
    at most `cap` bytes of it are read, never the data after it. The typed reader on top says
    what is wrong with a length over the cap or past the file."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        prefix = _read_upto(fd, 8)
        if len(prefix) < 8:
            return LengthPrefixed(size, None, b"")
        said = int.from_bytes(prefix, "little")
        if said > cap or 8 + said > size:
            return LengthPrefixed(size, said, b"")
        return LengthPrefixed(size, said, _read_upto(fd, said))
    finally:
        os.close(fd)


def read_head(path: Path | str, cap: int) -> bytes:
    """The first `cap` bytes of the regular file `path` (a script's shebang lines): a
    longer file is not refused, only not read further."""
    fd = open_regular(path)
    try:
        return os.read(fd, cap)
    finally:
        os.close(fd)


NOT_FOR_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _ancestors(path: str) -> list[str]:
    found = []
    parent = os.path.dirname(path)
    while True:
        found.append(parent)
        above = os.path.dirname(parent)
        if above == parent:
            return found
        parent = above


def secret_problem(
    path: Path | str, info: os.stat_result, group_gid: int | None
) -> tuple[str, str] | None:
    """What lets someone but root know or change the secret file `path` (`info` is the open
    file's fstat), or None. The rule is ssh's for its keys: the file owned by root and
    readable by nobody else, and every folder up its path, as named and as resolved, owned
    by root and writable by nobody else (a sticky world-writable folder such as /tmp too:
    anyone may create a name in it first). `group_gid`, the admin group where root's
    epycd.conf names one, may be the file's group with read access (mode 0640): its members
    may approve what runs anyway. Folders of that group are not trusted more.

    Returns (what fails, the fix)."""
    mode = stat.S_IMODE(info.st_mode)
    file_fix = f"chown root:root {path} && chmod 600 {path}"
    if info.st_uid != 0:
        return f"{path} is owned by uid {info.st_uid}, not root (mode {mode:o})", file_fix
    allowed = 0o040 if group_gid is not None and info.st_gid == group_gid else 0
    if mode & 0o077 & ~allowed:
        return f"{path} is readable or writable by others (mode {mode:o})", file_fix
    absolute = os.path.abspath(path)
    for start in dict.fromkeys((absolute, os.path.realpath(absolute))):
        for folder in _ancestors(start):
            held = os.stat(folder)
            held_mode = stat.S_IMODE(held.st_mode)
            fix = (
                f"chown root:root {folder} && chmod go-w {folder}, or keep the file in a "
                "folder only root can write, such as /etc/epyc-llm/secrets"
            )
            if held.st_uid != 0:
                return f"its folder {folder} is owned by uid {held.st_uid}, not root", fix
            if held_mode & NOT_FOR_OTHERS:
                return f"its folder {folder} is writable by others (mode {held_mode:o})", fix
    return None


def read_secret(path: Path | str, cap: int, *, group_gid: int | None = None) -> bytes:
    """`read_bytes` of a key or token file that only root controls (`secret_problem`); a
    `RefusedFile` (errno EPERM) saying which part fails otherwise."""
    fd = open_regular(path)
    try:
        problem = secret_problem(path, os.fstat(fd), group_gid)
        if problem is not None:
            refused = RefusedFile(errno.EPERM, problem[0], str(path))
            refused.fix = problem[1]
            raise refused
        return _read_fd(fd, path, cap)
    finally:
        os.close(fd)


def read_json_object(path: Path | str, cap: int, *, fix: str) -> dict[str, object]:
    """The JSON object in the regular file `path` (`read_bytes`'s rules and cap); an
    `InputError` naming the file and `fix` for bytes that are not UTF-8 JSON or not an object."""
    import json

    raw = read_bytes(path, cap)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"is not JSON ({type(exc).__name__}: {exc})", file=path, fix=fix) from None
    if not isinstance(data, dict):
        raise InputError(f"holds a JSON {type(data).__name__}, not an object", file=path, fix=fix)
    return data


def read_model(path: Path | str, cap: int, model: type[M], *, fix: str) -> M:
    """The regular file `path` (`read_bytes`'s rules and cap) validated by the pydantic
    `model`; an `InputError` naming the file, the first failing key and `fix` otherwise."""
    from pydantic import ValidationError

    raw = read_bytes(path, cap)
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc, file=path, fix=fix) from None


def read_sha256(path: Path | str) -> str:
    """The SHA-256 of the whole regular file `path` (`open_regular`'s rules), read in pieces:
    a model's weights, which no cap bounds and no caller holds in memory."""
    import hashlib

    hashed = hashlib.sha256()
    fd = open_regular(path)
    try:
        while chunk := os.read(fd, MIB):
            hashed.update(chunk)
    finally:
        os.close(fd)
    return hashed.hexdigest()
