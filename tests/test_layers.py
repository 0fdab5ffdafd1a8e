"""The layering of epycd/, enforced by walking every import (ast, including imports inside
functions): a module imports only from its own layer or the layers below it.

    7 commands          cli, daemon, __main__
    6 status            status
    5 render, approval  render, approval
    4 plan              plan
    3 inputs, serving   host, spec, model, stack; health, supervisor (what a unit runs)
    2 settings          settings
    1 foundation        epycd (the package: __version__), errors, text, paths, listen,
                        notify, systemd, names, sizes, atomic, readfile

docs/architecture.md explains each module and what crosses each boundary; its layer table
must be this one and it must name every module (the last test), so the map moves with the
code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.sandbox import REPO

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundation",
        frozenset(
            {"epycd", "errors", "text", "paths", "listen", "notify", "systemd"}
            | {"names", "sizes", "atomic", "readfile"}
        ),
    ),
    ("settings", frozenset({"settings"})),
    ("inputs, serving", frozenset({"host", "spec", "model", "stack", "health", "supervisor"})),
    ("plan", frozenset({"plan"})),
    ("render, approval", frozenset({"render", "approval"})),
    ("status", frozenset({"status"})),
    ("commands", frozenset({"cli", "daemon", "__main__"})),
)
"""Lowest first. An area is `epycd.AREA` (a module or a package)."""

KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported module) pairs that break the layering today. The test fails
on an entry that is no longer needed, so each is deleted once its import is gone."""

LAYER_OF = {area: rank for rank, (_, areas) in enumerate(LAYERS) for area in areas}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def area_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported_modules(tree: ast.AST, package: str) -> set[str]:
    """Every epycd module `tree` imports, `from epycd import x` as `epycd.x`."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parents, base])
            found.add(base.rstrip("."))
            if base.rstrip(".") == "epycd":
                found |= {f"epycd.{alias.name}" for alias in node.names}
    return {name for name in found if name == "epycd" or name.startswith("epycd.")}


def upward_imports(root: Path) -> dict[tuple[str, str], str]:
    """(module, imported) -> why, for every import of a higher layer under `root`/epycd."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted((root / "epycd").rglob("*.py")):
        module = module_name(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        area = area_of(module)
        assert area in LAYER_OF, f"{module}: add epycd.{area} to a layer in {__file__}"
        for imported in imported_modules(ast.parse(path.read_text()), package):
            target = area_of(imported)
            if imported == "epycd" or target == area:
                continue
            assert target in LAYER_OF, f"{module} imports {imported}: no layer holds it"
            if LAYER_OF[target] > LAYER_OF[area]:
                found[(module, imported)] = (
                    f"{module} ({LAYERS[LAYER_OF[area]][0]}) imports {imported} "
                    f"({LAYERS[LAYER_OF[target]][0]})"
                )
    return found


def test_no_module_imports_a_higher_layer() -> None:
    found = upward_imports(REPO)
    new = {pair: why for pair, why in found.items() if pair not in KNOWN_VIOLATIONS}
    assert not new, "upward imports:\n" + "\n".join(new.values())


def test_every_known_violation_still_exists() -> None:
    """An allow-list entry whose import is gone must go too, or it would hide a new one."""
    gone = sorted(set(KNOWN_VIOLATIONS) - set(upward_imports(REPO)))
    assert not gone, f"delete these from KNOWN_VIOLATIONS, their imports are gone: {gone}"


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("epycd/host/detect.py", "from epycd.cli.plan import gather_host\n"),
        ("epycd/plan/ports.py", "def f():\n    import epycd.status\n"),
        ("epycd/spec.py", "from epycd import approval\n"),
        ("epycd/render/text.py", "from ..status import collect_status\n"),
    ],
)
def test_an_upward_import_is_found(tmp_path: Path, where: str, source: str) -> None:
    """The walker finds a deliberate upward import in any form: absolute, inside a function,
    `from epycd import PACKAGE`, relative."""
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    [(module, imported)] = upward_imports(tmp_path)
    assert module == module_name(path, tmp_path)
    assert imported.split(".")[1] in {"cli", "status", "approval"}


def test_the_architecture_document_shows_this_table() -> None:
    """docs/architecture.md's layer table is LAYERS, and it names every area and every
    module of epycd/, so that the map stays the code's."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d) \| ([^|]+) \| ([^|]+) \|$", doc, re.MULTILINE)
    table = {int(rank): (name.strip(), frozenset(re.findall(r"`([\w_]+)`", areas)))
             for rank, name, areas in rows}  # fmt: skip
    assert table == {rank + 1: layer for rank, layer in enumerate(LAYERS)}
    for path in sorted((REPO / "epycd").rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            assert f"{path.stem}.py" in doc, f"docs/architecture.md does not name {path}"
