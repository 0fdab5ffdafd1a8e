"""A safetensors model served by llama.cpp through the GGUF file approve converts it to
(docs/conversion.md): where that file is (`converted_path`, one per source and weights,
shared by the endpoints that serve them), the record beside it that says what it is and what
it was made from (`ConvertedRecord`, NAME.gguf.json), and the planner's answer before it
exists (`NeedsConversion`: approve converts, then plans).

The file's name comes from the source's identity (`source_identity`: the resolved folder, or
the hub id at its commit), by a digest, never from a slug two sources can share. Its record
is usable (`current_record`) only while it still describes what is there: the file's size
and modification time as recorded, the same source identity, and, for a folder source, the
same files the conversion read (`source_changes`: size, time and inode, a few stat calls per
plan; the weights are hashed once, at conversion). Anything else is a reason, which the plan
gives: approve converts again, and an approved endpoint is `changed-needs-approval` with it.

A model the converter refused (`RefusedRecord`, NAME.gguf.refused.json, written by approve)
is refused by the planner with the converter's reason until llama.cpp's version changes, so
that `engine = "auto"` passes llama.cpp over for it instead of converting again.

Both records are read through epycd/readfile.py (`read_model`, at most `RECORD_MAX_BYTES`):
one that is a FIFO, a device, a folder, too large or not a record is a reason for that
endpoint alone (a refusal record that cannot be read is no refusal), never a wait.

The file's hash and the source's digest are in the plan (`ConvertedWeights`), so another
file is another plan: drift of an approved endpoint."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from pydantic import BaseModel

from epycd.atomic import write_atomic
from epycd.engines.llama_cpp.model.convert import DEFAULT_QUANTIZE, Conversion, Quantize
from epycd.engines.llama_cpp.model.source import (
    ConvertedSource,
    converted_files,
    source_changes,
    source_identity,
)
from epycd.errors import InputError
from epycd.plan.model import ConvertedWeights
from epycd.plan.prepared import MissingPrerequisite, Prerequisite
from epycd.readfile import RECORD_MAX_BYTES, read_model

ENGINE = "llama.cpp"

RECORD_SUFFIX = ".json"
REFUSED_SUFFIX = ".refused.json"
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
NOT_CONVERTED = "not converted yet"
NAME_CHARS = 48
"""The readable part of a converted file's name (the source's last name): for a person
only; the digest beside it is what tells sources apart."""


def needs_conversion(
    endpoint: str, model: str, revision: str | None, quantize: Quantize, output: Path, file: Path,
    hf_token_file: str | None = None, *, pooling: bool = False, why: str = NOT_CONVERTED,
) -> MissingPrerequisite:  # fmt: skip
    """The refusal of an endpoint whose model is not converted yet, or whose converted file
    no longer stands for its source (`why`): approve converts it; `pooling`: the model is an
    embedder or a reranker."""
    prerequisite = Prerequisite(
        engine=ENGINE,
        endpoint=endpoint,
        model=model,
        revision=revision,
        quantize=quantize,
        output=str(output),
        hf_token_file=hf_token_file,
    )
    state = (
        f"that is not converted yet ({output})"
        if why == NOT_CONVERTED
        else f"({output}) that must be converted again: {why}"
    )
    return MissingPrerequisite(
        prerequisite,
        f"llama.cpp serves {model} as a {quantize} GGUF file {state}",
        file=file,
        fix=f"epycctl approve {endpoint} converts it first (or run epycctl convert {model} "
        f"--quantize {quantize} --output {output})",
        pooling=pooling,
    )


class ConvertedRecord(BaseModel):
    """NAME.gguf.json beside a converted file."""

    source: str
    source_revision: str | None
    quantize: Quantize
    sha256: str
    bytes: int
    mtime_ns: int
    llama_cpp: str
    converted_from: ConvertedSource

    def weights(self) -> ConvertedWeights:
        return ConvertedWeights(
            source=self.source,
            source_revision=self.source_revision,
            quantize=self.quantize,
            sha256=self.sha256,
            source_identity=self.converted_from.identity,
            source_sha256=self.converted_from.sha256,
        )


def converted_path(
    converted_dir: Path, model: str, revision: str | None, quantize: Quantize
) -> Path:
    """converted_dir/NAME-DIGEST-QUANT.gguf: DIGEST the SHA-256 (128 bits of it) of the
    source's identity, so that two sources never share a file and one folder under two
    paths is one file."""
    identity = source_identity(model, revision)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    shown = os.path.realpath(model) if model.startswith("/") else model
    name = UNSAFE.sub("-", Path(shown.rstrip("/")).name).strip("-.")[:NAME_CHARS] or "model"
    return converted_dir / f"{name}-{digest}-{quantize.upper()}.gguf"


def record_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + RECORD_SUFFIX)


RECORD_FIX = "remove it: approve converts the model again and writes it"


def read_record(gguf: Path) -> ConvertedRecord | None:
    """The record beside `gguf` (`read_model`: a regular file, at most `RECORD_MAX_BYTES`);
    None when there is none; an `InputError` naming it when it cannot be read or is not a
    record."""
    path = record_path(gguf)
    try:
        return read_model(path, RECORD_MAX_BYTES, ConvertedRecord, fix=RECORD_FIX)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{exc.strerror or exc}", file=path, fix=RECORD_FIX) from None


def current_record(gguf: Path, model: str, revision: str | None) -> ConvertedRecord | str:
    """The record of `gguf` while it still describes the file there and the source as it is
    now (see the module docstring); otherwise why not, in words."""
    try:
        record = read_record(gguf)
    except InputError as exc:
        return f"its record is unreadable ({exc})"
    if record is None:
        return NOT_CONVERTED
    try:
        stat = os.stat(gguf)
    except OSError:
        return NOT_CONVERTED
    if (stat.st_size, stat.st_mtime_ns) != (record.bytes, record.mtime_ns):
        return f"{gguf} changed since its conversion"
    identity = source_identity(model, revision)
    if record.converted_from.identity != identity:
        return f"it was converted from {record.converted_from.identity}, not {identity}"
    if model.startswith("/"):
        changes = source_changes(record.converted_from.files, converted_files(Path(model)))
        if changes:
            return f"{model} changed since its conversion: " + "; ".join(changes)
    return record


def write_record(done: Conversion, source_revision: str | None) -> ConvertedRecord:
    gguf = Path(done.output)
    stat = gguf.stat()
    record = ConvertedRecord(
        source=done.model,
        source_revision=source_revision,
        quantize=done.quantize,
        sha256=done.sha256,
        bytes=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        llama_cpp=done.llama_cpp,
        converted_from=done.converted_from,
    )
    write_atomic(record_path(gguf), (json.dumps(record.model_dump(), indent=1) + "\n").encode())
    return record


class RefusedRecord(BaseModel):
    """NAME.gguf.refused.json: the converter failed on this model, and why."""

    source: str
    source_revision: str | None
    quantize: Quantize
    llama_cpp: str
    reason: str
    source_identity: str


def refused_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + REFUSED_SUFFIX)


def read_refused(gguf: Path, llama_cpp: str) -> RefusedRecord | None:
    """Why the converter of this llama.cpp version refused the model `gguf` is made from;
    None when it did not, or another version did (which this one may not repeat), or the
    record cannot be read (`read_model`: a FIFO or a device is not waited on): approve then
    converts, and records again what the converter says."""
    try:
        record = read_model(refused_path(gguf), RECORD_MAX_BYTES, RefusedRecord, fix=RECORD_FIX)
    except (OSError, InputError):
        return None
    return record if record.llama_cpp == llama_cpp else None


def write_refused(
    gguf: Path, source: str, source_revision: str | None, quantize: Quantize, llama_cpp: str,
    reason: str,
) -> Path:  # fmt: skip
    record = RefusedRecord(
        source=source,
        source_revision=source_revision,
        quantize=quantize,
        llama_cpp=llama_cpp,
        reason=reason,
        source_identity=source_identity(source, source_revision),
    )
    target = refused_path(gguf)
    write_atomic(target, (json.dumps(record.model_dump(), indent=1) + "\n").encode())
    return target


def quantize_of(value: str | None) -> Quantize:
    return value if value in ("q8_0", "q4_k_m", "bf16") else DEFAULT_QUANTIZE  # type: ignore[return-value]


def converter_python_present(python: Path) -> bool:
    return os.access(python, os.X_OK)
