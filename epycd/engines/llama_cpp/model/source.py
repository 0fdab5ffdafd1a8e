"""What a converted GGUF file is made from (docs/conversion.md, "Bound to its source").

- `source_identity`: the source, with nothing lost: the resolved folder of a model on disk,
  or the hub id at the commit it was downloaded at. The converted file's name is derived
  from it (a digest), so two sources never share a file.
- `converted_files`: the files the converter reads (config, tokenizer, weights; not the
  other formats of the same weights), as the disk has them: name, size, mtime_ns, inode.
  Stat calls only: cheap enough for every plan and status.
- `source_digest`: the SHA-256 of their content, read once, when the conversion runs.

The record beside a converted file holds the three (`ConvertedSource`). A plan compares the
files of a folder source as they are now with the recorded ones (`source_changes`): a file
rewritten, touched, replaced, added or removed since the conversion is a changed source, and
the endpoint waits for a conversion again. A hub source is bound by its commit, which names
its content; the cache's copy is not compared (the planner may hold only its small files).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from epycd.errors import InputError
from epycd.readfile import read_sha256

NOT_WEIGHTS = ["*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.gguf"]
"""A hub repository's files the converter never reads (other formats of the same weights)."""
NOT_WEIGHTS_FOLDERS = ["onnx/*", "openvino/*", "coreml/*", "flax_model*", "tf_model*"]
MAX_SOURCE_FILES = 4096
"""A model folder holds tens of files; a folder with more is not a model folder."""
SHOWN_CHANGES = 3


class SourceFile(BaseModel):
    """One file the converter reads, as the disk had it: another size, time or inode is
    another file."""

    model_config = ConfigDict(frozen=True)

    name: str
    bytes: int
    mtime_ns: int
    inode: int


class ConvertedSource(BaseModel):
    """What a conversion read: the source's identity, its files and their content's digest."""

    model_config = ConfigDict(frozen=True)

    identity: str
    files: list[SourceFile]
    sha256: str


def source_identity(model: str, revision: str | None) -> str:
    """`folder:REALPATH` for a model on disk (two paths to one folder are one source), or
    `hub:ORG/NAME@COMMIT`."""
    if model.startswith("/"):
        return "folder:" + os.path.realpath(model)
    return f"hub:{model}@{revision or 'unresolved'}"


def _read_by_converter(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    if any(part.startswith(".") for part in name.split("/")):
        return False  # .git, .cache: never the model's
    if any(fnmatch.fnmatch(base, pattern) for pattern in NOT_WEIGHTS):
        return False
    return not any(fnmatch.fnmatch(name, pattern) for pattern in NOT_WEIGHTS_FOLDERS)


def converted_files(folder: Path) -> list[SourceFile]:
    """The files of `folder` the converter reads, by relative name; symlinks followed (a hub
    snapshot's files are links to its blobs), a dangling one left out."""
    found: list[SourceFile] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for base in names:
            name = os.path.relpath(os.path.join(root, base), folder)
            if not _read_by_converter(name):
                continue
            try:
                info = os.stat(folder / name)
            except FileNotFoundError:
                continue
            found.append(SourceFile(name=name, bytes=info.st_size, mtime_ns=info.st_mtime_ns,
                                    inode=info.st_ino))  # fmt: skip
            if len(found) > MAX_SOURCE_FILES:
                raise InputError(
                    f"holds more than {MAX_SOURCE_FILES} files: not a model folder",
                    file=folder,
                    key="model",
                    fix="point model at the folder of one model (its config.json, tokenizer "
                    "and safetensors)",
                )
    return sorted(found, key=lambda file: file.name)


def source_digest(folder: Path, files: list[SourceFile]) -> str:
    """The SHA-256 of the files' names and contents (each read through `read_sha256`: a
    FIFO or device among them is refused, never read)."""
    hashed = hashlib.sha256()
    for file in files:
        hashed.update(f"{file.name}\0{read_sha256(folder / file.name)}\n".encode())
    return hashed.hexdigest()


def read_converted_source(model: str, folder: Path, revision: str | None) -> ConvertedSource:
    """`model` (its files in `folder`, at the hub commit `revision`) as a conversion reads
    it: its identity, its files and their content's digest."""
    files = converted_files(folder)
    digest = source_digest(folder, files)
    return ConvertedSource(identity=source_identity(model, revision), files=files, sha256=digest)


def source_changes(recorded: list[SourceFile], now: list[SourceFile]) -> list[str]:
    """What differs between the files a conversion read and the files there now, in words
    (at most `SHOWN_CHANGES`, then how many more)."""
    before = {file.name: file for file in recorded}
    after = {file.name: file for file in now}
    changes: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None:
            changes.append(f"{name} is new")
        elif new is None:
            changes.append(f"{name} is gone")
        elif old.bytes != new.bytes:
            changes.append(f"{name} was rewritten (size {old.bytes} -> {new.bytes} bytes)")
        elif old != new:
            changes.append(f"{name} was modified or replaced (its time or inode)")
    if len(changes) > SHOWN_CHANGES:
        more = len(changes) - SHOWN_CHANGES
        changes = [*changes[:SHOWN_CHANGES], f"{more} more"]
    return changes
