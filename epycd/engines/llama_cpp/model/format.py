"""GGUF, llama.cpp's own model format (`epycd.model.formats.ModelFormat`): a model that names a
.gguf file, or gives the endpoint file's `gguf_file`, is read here from the file's own metadata
(`gguf.py`); llama.cpp serves it where its pinned source knows the architecture.

llama.cpp's architectures are one JSON file per pinned llama.cpp source in `data/llama.cpp/`:
the `LLM_ARCH_NAMES` map of its `src/llama-arch.cpp`, the `general.architecture` values a GGUF
file may carry and that build loads. It is read from the source, never compiled; an
architecture missing from it is one that build refuses to load. What a file *is* is decided
here: an embedder (`EMBEDDERS`, or an embedding pooling type in the file), a reranker (rank
pooling, or a one-output classifier head), text generation, or an encoder, draft head or audio
decoder that no endpoint serves (`NOT_TEXT_GENERATION`).

Make a table from the pinned source (the sdist the runtime recipe builds from, or a folder):

    python -m epycd.engines.llama_cpp.model.format llama_cpp_python-0.3.36.tar.gz --version 0.3.36
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tarfile
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import kv_bytes_per_token
from epycd.errors import InputError
from epycd.model.facts import ChatTemplate, EngineSupport, GgufFile, ModelFacts
from epycd.model.formats import (
    InspectRequest,
    ModelFormat,
    catch_all_support,
    in_registry_order,
)
from epycd.model.hub import is_gguf, locate_gguf
from epycd.model.tables import available_versions, data_dir
from epycd.model.template import endpoints, template_from_override

ARCH_SOURCE = "src/llama-arch.cpp"
CONVERTER_MAP_SOURCE = "conversion/__init__.py"
CONVERTER_MAP = "TEXT_MODEL_MAP"
ARCH_MAP = re.compile(r"LLM_ARCH_NAMES\s*=\s*\{(?P<body>.*?)\n\};", re.DOTALL)
ARCH_ENTRY = re.compile(r'\{\s*LLM_ARCH_[A-Z0-9_]+\s*,\s*"(?P<name>[^"]+)"\s*\}')

EMBEDDERS = {
    "bert": "an embedding encoder",
    "modern-bert": "an embedding encoder",
    "nomic-bert": "an embedding encoder",
    "nomic-bert-moe": "an embedding encoder",
    "neo-bert": "an embedding encoder",
    "jina-bert-v2": "an embedding encoder",
    "jina-bert-v3": "an embedding encoder",
    "eurobert": "an embedding encoder",
    "gemma-embedding": "an embedding model",
    "llama-embed": "an embedding model",
}
"""Architectures llama-server serves on /v1/embeddings (`--embeddings`), and only there."""
NOT_TEXT_GENERATION = {
    "clip": "a vision encoder (llama-quantize's placeholder)",
    "t5encoder": "an encoder without a decoder",
    "wavtokenizer-dec": "an audio decoder",
    "eagle3": "a speculative-decoding draft head",
    "dflash": "a speculative-decoding draft head",
}
"""Architectures llama-server loads but serves no endpoint of from."""
EMBEDDING_POOLING = ("mean", "cls", "last")
"""A file's pooling types of an embedder; "rank" is a reranker's (`--rerank`)."""


class LlamaTable(BaseModel):
    """The architectures one pinned llama.cpp source knows."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(description="the pinned source's version (llama-cpp-python's sdist)")
    source: str = Field(description="the file the table was read from")
    architectures: list[str] = Field(description="LLM_ARCH_NAMES values, in source order")
    converts: list[str] = Field(
        default_factory=list,
        description="the Hugging Face architectures (config.json `architectures`) the "
        "source's convert_hf_to_gguf.py turns into GGUF: its TEXT_MODEL_MAP, sorted",
    )


def parse_architectures(source: str, *, origin: str = ARCH_SOURCE) -> list[str]:
    match = ARCH_MAP.search(source)
    if match is None:
        raise InputError(f"no LLM_ARCH_NAMES map in {origin}", file=origin)
    names = [
        entry["name"]
        for entry in ARCH_ENTRY.finditer(match["body"])
        if not entry["name"].startswith("(")  # LLM_ARCH_UNKNOWN's "(unknown)"
    ]
    if not names:
        raise InputError(f"LLM_ARCH_NAMES in {origin} names no architecture", file=origin)
    return names


def parse_converter_map(source: str, *, origin: str = CONVERTER_MAP_SOURCE) -> list[str]:
    """The keys of the converter's `TEXT_MODEL_MAP` (HF architecture -> its conversion
    module), read from its source without running it (it imports torch)."""
    for node in ast.walk(ast.parse(source, filename=origin)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        if not any(isinstance(t, ast.Name) and t.id == CONVERTER_MAP for t in targets):
            continue
        value = getattr(node, "value", None)
        names = {k.value for k in getattr(value, "keys", []) if isinstance(k, ast.Constant)}
        if names:
            return sorted(str(name) for name in names)
    raise InputError(f"no {CONVERTER_MAP} of architectures in {origin}", file=origin)


def read_source_file(path: Path, name: str) -> str:
    """The file `name` (a path in llama.cpp's tree) from an sdist (anywhere under it) or a
    source folder."""
    if path.is_dir():
        found = sorted(path.rglob(name))
        if not found:
            raise InputError(f"no {name} under the folder", file=path)
        return found[0].read_text()
    try:
        with tarfile.open(path) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(f"/{name}")), None)
            handle = tar.extractfile(member) if member else None
            if handle is None:
                raise InputError(f"no {name} in the archive", file=path)
            return handle.read().decode()
    except (OSError, tarfile.TarError) as exc:
        raise InputError(f"unreadable llama.cpp source: {exc}", file=path) from None


def build_table(path: Path, version: str) -> LlamaTable:
    return LlamaTable(
        version=version,
        source=path.name,
        architectures=parse_architectures(read_source_file(path, ARCH_SOURCE), origin=str(path)),
        converts=parse_converter_map(
            read_source_file(path, CONVERTER_MAP_SOURCE), origin=str(path)
        ),
    )


def tables_dir() -> Path:
    return data_dir() / "llama.cpp"


def pinned_version() -> str:
    """The newest table's version: the llama.cpp source the runtime recipe pins."""
    versions = available_versions(tables_dir())
    if not versions:
        raise InputError("no llama.cpp architecture table", file=tables_dir())
    return versions[-1]


@cache
def load_table(version: str) -> LlamaTable:
    return LlamaTable.model_validate_json((tables_dir() / f"{version}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m epycd.engines.llama_cpp.model.format",
        description="Write data/llama.cpp/<version>.json from the pinned llama.cpp source",
    )
    parser.add_argument("source", type=Path, help="llama-cpp-python sdist (.tar.gz) or a folder")
    parser.add_argument("--version", required=True, help="the pinned source's version")
    parser.add_argument("--out", type=Path, default=None, help="folder (default data/llama.cpp)")
    args = parser.parse_args(argv)
    try:
        table = build_table(args.source, args.version)
    except InputError as exc:
        print(f"llama_tables: {exc}", file=sys.stderr)
        return exc.exit_code
    out_dir: Path = args.out or tables_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{args.version}.json"
    target.write_text(json.dumps(table.model_dump(), indent=1) + "\n")
    print(
        f"wrote {target}: {len(table.architectures)} architectures, "
        f"{len(table.converts)} the converter takes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())


ENGINE = "llama.cpp"


class GgufFormat(ModelFormat):
    engine = ENGINE
    name = "gguf"

    def holds(self, request: InspectRequest) -> bool:
        return is_gguf(request.model, request.file)

    def inspect(self, request: InspectRequest, others: list[EngineSupport]) -> ModelFacts:
        """A GGUF file's facts: llama.cpp serves it where its pinned source knows the
        architecture."""
        model = request.model
        source = locate_gguf(model, request.file, revision=request.revision)
        gguf = read_gguf(source.path, name=source.name)
        notes = list(source.warnings)
        known = architecture_support(
            gguf.architecture, gguf.pooling_type, classifier_outputs=gguf.classifier_outputs
        )
        template = (
            template_from_override(request.chat_template_override)
            if request.chat_template_override
            else ChatTemplate(
                status="present" if gguf.chat_template else "absent",
                source="the GGUF file (tokenizer.chat_template)" if gguf.chat_template else None,
            )
        )
        primary, supported_endpoints, launchable = endpoints(known.kind, template)
        kv_per_token = kv_bytes_per_token(gguf)
        if kv_per_token is None:
            notes.append(
                "the GGUF file lacks the attention figures: KV bytes per token unknown (0)"
            )
        own = EngineSupport(
            engine=ENGINE,
            version=known.version,
            supported=known.supported and launchable,
            kind=known.kind,
            reason=verdict(gguf, known, template, launchable),
        )
        return ModelFacts(
            model=model,
            format="gguf",
            gguf=gguf,
            engines=in_registry_order([*others, own]),
            revision=source.revision,
            local_path=str(source.path),
            architectures=[gguf.architecture],
            model_type=gguf.architecture,
            torch_dtype=gguf.file_type,
            support=catch_all_support(others),
            chat_template=template,
            primary_endpoint=primary if known.supported else None,
            supported_endpoints=supported_endpoints if known.supported else [],
            launchable=bool(known.supported and launchable),
            gated=None,
            weights_bytes=gguf.tensors_bytes,
            weights_source="gguf-tensors",
            kv_bytes_per_token=kv_per_token or 0,
            max_position_embeddings=gguf.context_length,
            embedding_width=gguf.embedding_length if primary == "embeddings" else None,
            message=own.reason,
            warnings=notes,
        )

    def elsewhere(self, holder: ModelFormat, request: InspectRequest) -> EngineSupport:
        return EngineSupport(
            engine=ENGINE,
            version=pinned_version(),
            supported=False,
            kind="unsupported",
            reason="llama.cpp serves GGUF files: choose a GGUF file of this model "
            "(gguf_file), or convert it with llama.cpp's convert_hf_to_gguf.py",
        )


FORMAT = GgufFormat()


def architecture_support(
    architecture: str, pooling_type: str | None = None, *, classifier_outputs: int | None = None
) -> EngineSupport:
    """llama.cpp's answer for a GGUF architecture, from its pinned source's table, and the
    file's pooling type: a reranker's (rank), an embedder's, or none for a text model. A file
    with no pooling type and a one-output classifier head is a reranker too: llama.cpp's
    converter writes a sequence classifier such as bge-reranker so, and llama-server scores
    with that head under `--rerank`."""
    version = pinned_version()
    known = architecture in load_table(version).architectures
    if not known:
        reason = f"llama.cpp {version} does not know the architecture {architecture!r}"
        return EngineSupport(
            engine=ENGINE, version=version, supported=False, kind="unsupported", reason=reason
        )
    if pooling_type == "rank" or (pooling_type is None and classifier_outputs == 1):
        how = "rank pooling" if pooling_type else "a one-output classifier head"
        reason = f"{architecture} with {how} is a reranker: /v1/rerank (--rerank)"
        return EngineSupport(
            engine=ENGINE, version=version, supported=True, kind="rerank", reason=reason
        )
    if architecture in EMBEDDERS or pooling_type in EMBEDDING_POOLING:
        what = EMBEDDERS.get(architecture, f"an embedder ({pooling_type} pooling)")
        reason = f"{architecture} is {what}: /v1/embeddings (--embeddings)"
        return EngineSupport(
            engine=ENGINE, version=version, supported=True, kind="embedding", reason=reason
        )
    if not_text := NOT_TEXT_GENERATION.get(architecture):
        return EngineSupport(
            engine=ENGINE,
            version=version,
            supported=False,
            kind="pooling",
            reason=f"{architecture} is {not_text}: no endpoint serves it",
        )
    return EngineSupport(
        engine=ENGINE, version=version, supported=True, kind="text", reason="known"
    )


def verdict(gguf: GgufFile, known: EngineSupport, template: ChatTemplate, launchable: bool) -> str:
    """One sentence for a person, as `epycd.model.check.verdict` says it for vLLM."""
    quant = f"{gguf.file_type} " if gguf.file_type else ""
    if not known.supported:
        return f"not servable: {known.reason}"
    lead = f"servable by llama.cpp {known.version}: {quant}{gguf.architecture} GGUF"
    if known.kind in ("embedding", "rerank"):
        return f"{lead}, {known.reason}"
    if template.status == "present":
        return f"{lead}; /v1/chat/completions (template from {template.source})"
    return (
        f"{lead}; /v1/completions only, the file has no chat template: give "
        "chat_template = <file> in the endpoint file to enable chat"
    )
