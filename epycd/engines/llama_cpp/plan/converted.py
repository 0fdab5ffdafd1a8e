"""A safetensors model served by llama.cpp through the GGUF file approve converts it to
(docs/conversion.md): where that file is (`converted_path`, one per model, revision and
weights, shared by the endpoints that serve them), the record beside it that says what it is
(`ConvertedRecord`, NAME.gguf.json), and the planner's answer before it exists
(`NeedsConversion`: approve converts, then plans).

A model the converter refused (`RefusedRecord`, NAME.gguf.refused.json, written by approve)
is refused by the planner with the converter's reason until llama.cpp's version changes, so
that `engine = "auto"` passes llama.cpp over for it instead of converting again.

A record whose file's size or modification time no longer match is no record: the file
changed since its conversion, and approve converts again. The file's hash is in the plan
(`ConvertedWeights.sha256`), so another file is another plan: drift of an approved
endpoint."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pydantic import BaseModel, ValidationError

from epycd.atomic import write_atomic
from epycd.engines.llama_cpp.model.convert import DEFAULT_QUANTIZE, Conversion, Quantize
from epycd.plan.model import ConvertedWeights
from epycd.plan.prepared import MissingPrerequisite, Prerequisite

ENGINE = "llama.cpp"

RECORD_SUFFIX = ".json"
REFUSED_SUFFIX = ".refused.json"
UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def needs_conversion(
    endpoint: str, model: str, revision: str | None, quantize: Quantize, output: Path, file: Path,
    hf_token_file: str | None = None, *, pooling: bool = False,
) -> MissingPrerequisite:  # fmt: skip
    """The refusal of an endpoint whose model is not converted yet: approve converts it;
    `pooling`: the model is an embedder or a reranker."""
    prerequisite = Prerequisite(
        engine=ENGINE,
        endpoint=endpoint,
        model=model,
        revision=revision,
        quantize=quantize,
        output=str(output),
        hf_token_file=hf_token_file,
    )
    return MissingPrerequisite(
        prerequisite,
        f"llama.cpp serves {model} as a {quantize} GGUF file that is not converted yet ({output})",
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

    def weights(self) -> ConvertedWeights:
        return ConvertedWeights(
            source=self.source,
            source_revision=self.source_revision,
            quantize=self.quantize,
            sha256=self.sha256,
        )


def converted_path(
    converted_dir: Path, model: str, revision: str | None, quantize: Quantize
) -> Path:
    """converted_dir/SLUG[@REVISION]-QUANT.gguf: one file per model, revision and weights."""
    slug = UNSAFE.sub("--", model.strip("/")).strip("-") or "model"
    at = f"@{UNSAFE.sub('-', revision)}" if revision else ""
    return converted_dir / f"{slug}{at}-{quantize.upper()}.gguf"


def record_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + RECORD_SUFFIX)


def read_record(gguf: Path) -> ConvertedRecord | None:
    """The record of a converted file that is still the file it describes; None when either
    is missing or the file changed since."""
    try:
        record = ConvertedRecord.model_validate_json(record_path(gguf).read_text())
        stat = gguf.stat()
    except (OSError, ValueError, ValidationError):
        return None
    if (stat.st_size, stat.st_mtime_ns) != (record.bytes, record.mtime_ns):
        return None
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


def refused_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + REFUSED_SUFFIX)


def read_refused(gguf: Path, llama_cpp: str) -> RefusedRecord | None:
    """Why the converter of this llama.cpp version refused the model `gguf` is made from;
    None when it did not, or another version did (which this one may not repeat)."""
    try:
        record = RefusedRecord.model_validate_json(refused_path(gguf).read_text())
    except (OSError, ValueError, ValidationError):
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
    )
    target = refused_path(gguf)
    write_atomic(target, (json.dumps(record.model_dump(), indent=1) + "\n").encode())
    return target


def quantize_of(value: str | None) -> Quantize:
    return value if value in ("q8_0", "q4_k_m", "bf16") else DEFAULT_QUANTIZE  # type: ignore[return-value]


def converter_python_present(python: Path) -> bool:
    return os.access(python, os.X_OK)
