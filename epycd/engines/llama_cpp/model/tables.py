"""llama.cpp's architectures, one JSON file per pinned llama.cpp source in `data/llama.cpp/`.

A table is the `LLM_ARCH_NAMES` map of the pinned source's `src/llama-arch.cpp`: the
`general.architecture` values a GGUF file may carry and that build loads. It is read from the
source, never compiled; an architecture missing from it is one that build refuses to load.
What an architecture *is* (text generation, or an encoder, embedder, draft head or audio
decoder that has no chat or completions endpoint) is decided here from `NOT_TEXT_GENERATION`.

Make a table from the pinned source (the sdist the runtime recipe builds from, or a folder):

    python -m epycd.engines.llama_cpp.model.tables llama_cpp_python-0.3.36.tar.gz --version 0.3.36
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from epycd.errors import InputError
from epycd.model.registry_tables import available_versions, data_dir

ARCH_SOURCE = "src/llama-arch.cpp"
ARCH_MAP = re.compile(r"LLM_ARCH_NAMES\s*=\s*\{(?P<body>.*?)\n\};", re.DOTALL)
ARCH_ENTRY = re.compile(r'\{\s*LLM_ARCH_[A-Z0-9_]+\s*,\s*"(?P<name>[^"]+)"\s*\}')

NOT_TEXT_GENERATION = {
    "clip": "a vision encoder (llama-quantize's placeholder)",
    "bert": "an embedding encoder",
    "modern-bert": "an embedding encoder",
    "nomic-bert": "an embedding encoder",
    "nomic-bert-moe": "an embedding encoder",
    "neo-bert": "an embedding encoder",
    "jina-bert-v2": "an embedding encoder",
    "jina-bert-v3": "an embedding encoder",
    "eurobert": "an embedding encoder",
    "t5encoder": "an encoder without a decoder",
    "gemma-embedding": "an embedding model",
    "llama-embed": "an embedding model",
    "wavtokenizer-dec": "an audio decoder",
    "eagle3": "a speculative-decoding draft head",
    "dflash": "a speculative-decoding draft head",
}
"""Architectures llama-server loads but cannot serve chat or completions from."""


class LlamaTable(BaseModel):
    """The architectures one pinned llama.cpp source knows."""

    model_config = ConfigDict(extra="forbid")

    version: str = Field(description="the pinned source's version (llama-cpp-python's sdist)")
    source: str = Field(description="the file the table was read from")
    architectures: list[str] = Field(description="LLM_ARCH_NAMES values, in source order")


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


def read_arch_source(path: Path) -> str:
    """`src/llama-arch.cpp` from an sdist (anywhere under it) or a source folder."""
    if path.is_dir():
        found = sorted(path.rglob(ARCH_SOURCE))
        if not found:
            raise InputError(f"no {ARCH_SOURCE} under the folder", file=path)
        return found[0].read_text()
    try:
        with tarfile.open(path) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(f"/{ARCH_SOURCE}")), None)
            handle = tar.extractfile(member) if member else None
            if handle is None:
                raise InputError(f"no {ARCH_SOURCE} in the archive", file=path)
            return handle.read().decode()
    except (OSError, tarfile.TarError) as exc:
        raise InputError(f"unreadable llama.cpp source: {exc}", file=path) from None


def build_table(path: Path, version: str) -> LlamaTable:
    return LlamaTable(
        version=version,
        source=path.name,
        architectures=parse_architectures(read_arch_source(path), origin=str(path)),
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
        prog="python -m epycd.engines.llama_cpp.model.tables",
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
    print(f"wrote {target}: {len(table.architectures)} architectures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
