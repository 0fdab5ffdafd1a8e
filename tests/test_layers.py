"""The layering of epycd/, enforced by walking every import (ast, including imports inside
functions): a module imports only from its own layer or the layers below it.

    8 commands          cli, daemon, __main__; an engine's own commands (`commands.py`)
    7 metrics           metrics
    6 status            status
    5 render, approval  render, approval, export
    4 plan              plan
    3 inputs, serving   host, spec, model, stack; health, supervisor (what a unit runs)
    2 settings          settings
    1 foundation        epycd (the package: __version__), errors, text, paths, listen,
                        notify, systemd, names, sizes, atomic, readfile, events, childproc,
                        engines

docs/architecture.md explains each module and what crosses each boundary; its layer table
must be this one and it must name every module (the last test), so the map moves with the
code.

Within and across layers, no module may take part in an import cycle (`KNOWN_CYCLES` holds
today's, each deleted once broken), and none may grow past `MAX_MODULE_LINES` (`KNOWN_LARGE`
holds today's, each deleted once split).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox import REPO

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundation",
        frozenset(
            {"epycd", "errors", "text", "paths", "listen", "notify", "systemd"}
            | {"names", "sizes", "atomic", "readfile", "events", "childproc", "engines"}
        ),
    ),
    ("settings", frozenset({"settings"})),
    (
        "inputs, serving",
        frozenset({"host", "spec", "model", "stack", "health", "supervisor", "servebench"}),
    ),
    ("plan", frozenset({"plan"})),
    ("render, approval", frozenset({"render", "approval", "export", "gateway"})),
    ("status", frozenset({"status"})),
    ("metrics", frozenset({"metrics"})),
    ("commands", frozenset({"cli", "daemon", "__main__", "commands"})),
)
"""Lowest first. An area is `epycd.AREA` (a module or a package)."""

KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported module) pairs that break the layering today. The test fails
on an entry that is no longer needed, so each is deleted once its import is gone."""

KNOWN_CYCLES: tuple[frozenset[str], ...] = ()
"""The import cycles (strongly connected components of the module graph) there are today.
The tests fail on any other cycle, and on an entry that is no longer exactly a cycle: when
one shrinks, replace its entry by what is left; when it is gone, delete it."""

MAX_MODULE_LINES = 600
KNOWN_LARGE: frozenset[str] = frozenset()
"""Modules over `MAX_MODULE_LINES` today (paths from the repository root); each is deleted
once split below it, and the tests fail on a module that is no longer here or no longer
large."""

LAYER_OF = {area: rank for rank, (_, areas) in enumerate(LAYERS) for area in areas}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def area_of(module: str) -> str:
    """The area of a module; an engine's own stage (`epycd.engines.ENGINE.AREA...`, its plan
    or its render) belongs to that stage's area, above the engine's running-side facts."""
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "engines" and parts[3] in LAYER_OF:
        return parts[3]
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


PLAN_PARTS = ("", "service", "placement", "engines", "pipeline")
"""epycd/plan/ by what it does, lowest first: the plan's types and rules (the modules of
plan/ itself), what every endpoint's service has, where servers run and what is held, what
each engine does for the planner, and the planning pipeline. A part imports only from its
own part or a lower one (docs/architecture.md)."""


def plan_part(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in PLAN_PARTS[1:] else ""


def upward_plan_imports(root: Path) -> list[str]:
    """`module -> imported` for each import of a higher part of plan/, in any scope."""
    found = []
    for path in sorted((root / "epycd" / "plan").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        if path.name == "__init__.py":
            module = package = module.removesuffix(".__init__")
        else:
            package = module.rpartition(".")[0]
        mine = PLAN_PARTS.index(plan_part(module))
        for imported in imported_modules(ast.parse(path.read_text()), package):
            if imported.startswith("epycd.plan.") and PLAN_PARTS.index(plan_part(imported)) > mine:
                found.append(f"{module} -> {imported}")
    return found


def test_no_part_of_the_plan_imports_a_higher_part() -> None:
    assert upward_plan_imports(REPO) == []


def test_an_upward_import_within_the_plan_is_found(tmp_path: Path) -> None:
    service = tmp_path / "epycd" / "plan" / "service"
    service.mkdir(parents=True)
    (service / "served.py").write_text("def f():\n    from epycd.plan.pipeline import build\n")
    (service / "homes.py").write_text("from epycd.plan.endpoint import Plan\n")
    assert upward_plan_imports(tmp_path) == ["epycd.plan.service.served -> epycd.plan.pipeline"]


def test_every_known_violation_still_exists() -> None:
    """An allow-list entry whose import is gone must go too, or it would hide a new one."""
    gone = sorted(set(KNOWN_VIOLATIONS) - set(upward_imports(REPO)))
    assert not gone, f"delete these from KNOWN_VIOLATIONS, their imports are gone: {gone}"


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("epycd/host/detect.py", "from epycd.cli.plan import gather_host\n"),
        ("epycd/plan/placement/ports.py", "def f():\n    import epycd.status\n"),
        ("epycd/spec.py", "from epycd import approval\n"),
        ("epycd/render/text.py", "from ..status import collect_status\n"),
        ("epycd/engines/base.py", "from epycd.engines.vllm.plan import planner\n"),
        ("epycd/engines/x/plan/decide.py", "from epycd.status import collect_status\n"),
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
    assert area_of(imported) in {"cli", "status", "approval", "plan"}


def is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that runs, at the top or inside a function: all but the body of an
    `if TYPE_CHECKING:` (its `else:` runs)."""
    if isinstance(tree, ast.Import | ast.ImportFrom):
        yield tree
        return
    if isinstance(tree, ast.If) and is_type_checking(tree.test):
        for node in tree.orelse:
            yield from runtime_import_nodes(node)
        return
    for child in ast.iter_child_nodes(tree):
        yield from runtime_import_nodes(child)


def epycd_modules(root: Path) -> dict[str, Path]:
    """Module name -> its file, for every module under `root`/epycd."""
    return {module_name(path, root): path for path in sorted((root / "epycd").rglob("*.py"))}


def import_targets(
    node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]
) -> set[str]:
    """The epycd modules one import statement runs: `from pkg import sub` is the submodule
    when `sub` is one (else `pkg` itself), relative imports resolved against `package`."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parents = parts[: len(parts) - node.level + 1]
        base = ".".join([*parents, base]).rstrip(".")
    found = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.add(sub if sub in modules else base)
    return {name for name in found if name in modules}


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the epycd modules it imports at run time (imports inside functions too)."""
    modules = epycd_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        graph[module] = {
            target
            for node in runtime_import_nodes(ast.parse(path.read_text()))
            for target in import_targets(node, package, modules)
            if target != module
        }
    return graph


def import_cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def describe(cycle: frozenset[str]) -> str:
    return " <-> ".join(sorted(cycle))


def cycle_drift(
    root: Path, known: tuple[frozenset[str], ...]
) -> tuple[set[frozenset[str]], set[frozenset[str]]]:
    """(the cycles under `root` that `known` lacks, the `known` entries that are no longer
    exactly a cycle there)."""
    found = import_cycles(module_graph(root))
    return found - set(known), set(known) - found


def test_no_new_import_cycle() -> None:
    new, _ = cycle_drift(REPO, KNOWN_CYCLES)
    assert not new, "import cycles not in KNOWN_CYCLES (break them):\n" + "\n".join(
        describe(cycle) for cycle in sorted(new, key=describe)
    )


def test_every_known_cycle_still_exists() -> None:
    """An entry that is no longer exactly a cycle hides nothing: it must be edited (a cycle
    that shrank) or deleted (one that is gone)."""
    _, gone = cycle_drift(REPO, KNOWN_CYCLES)
    assert not gone, "these KNOWN_CYCLES entries are no longer cycles, edit or delete them:\n" + (
        "\n".join(describe(cycle) for cycle in sorted(gone, key=describe))
    )


def write_modules(root: Path, sources: dict[str, str]) -> None:
    for where, source in sources.items():
        path = root / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


@pytest.mark.parametrize(
    "back",
    [
        "def f():\n    import epycd.plan.a\n",
        "def f():\n    from epycd.plan import a\n",
        "def f():\n    from epycd.plan.a import thing\n",
        "def f():\n    from . import a\n",
        "def f():\n    from .a import thing\n",
    ],
)
def test_a_lazy_back_import_is_a_cycle(tmp_path: Path, back: str) -> None:
    """A top-level import one way and an import inside a function the other way, in each
    form the back import can take, is a cycle."""
    write_modules(
        tmp_path,
        {
            "epycd/__init__.py": "",
            "epycd/plan/__init__.py": "",
            "epycd/plan/a.py": "from epycd.plan.b import helper\nthing = 1\n",
            "epycd/plan/b.py": back + "helper = 2\n",
        },
    )
    assert import_cycles(module_graph(tmp_path)) == {frozenset({"epycd.plan.a", "epycd.plan.b"})}


def test_a_broken_or_shrunk_cycle_is_a_stale_entry(tmp_path: Path) -> None:
    """a -> b -> c -> a shrinks to a <-> b: the old entry is stale and the new one is new;
    a known entry whose cycle is gone altogether is stale."""
    write_modules(
        tmp_path,
        {
            "epycd/__init__.py": "",
            "epycd/a.py": "import epycd.b\n",
            "epycd/b.py": "import epycd.c\ndef f():\n    import epycd.a\n",
            "epycd/c.py": "",
        },
    )
    was = frozenset({"epycd.a", "epycd.b", "epycd.c"})
    gone = frozenset({"epycd.c", "epycd.d"})
    new, stale = cycle_drift(tmp_path, (was, gone))
    assert new == {frozenset({"epycd.a", "epycd.b"})}
    assert stale == {was, gone}


@pytest.mark.parametrize(
    "submodule", ["from epycd.render import commands", "from . import commands"]
)
def test_a_submodule_import_is_no_cycle_with_its_package(tmp_path: Path, submodule: str) -> None:
    """render/__init__ imports quadlet, and quadlet imports render's `commands` submodule:
    that is an edge to render.commands, not back to render/__init__."""
    write_modules(
        tmp_path,
        {
            "epycd/__init__.py": "",
            "epycd/render/__init__.py": "from epycd.render.quadlet import render_container\n",
            "epycd/render/quadlet.py": f"{submodule}\nrender_container = commands\n",
            "epycd/render/commands.py": "",
        },
    )
    graph = module_graph(tmp_path)
    assert graph["epycd.render.quadlet"] == {"epycd.render.commands"}
    assert import_cycles(graph) == set()


def test_type_checking_imports_are_no_cycle(tmp_path: Path) -> None:
    """Imports under `if TYPE_CHECKING:` never run; its `else:` branch does."""
    write_modules(
        tmp_path,
        {
            "epycd/__init__.py": "",
            "epycd/a.py": "import epycd.b\n",
            "epycd/b.py": (
                "import typing\nfrom typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from epycd.a import x\n"
                "if typing.TYPE_CHECKING:\n    import epycd.a\nelse:\n    import epycd.c\n"
            ),
            "epycd/c.py": "",
        },
    )
    graph = module_graph(tmp_path)
    assert graph["epycd.b"] == {"epycd.c"}
    assert import_cycles(graph) == set()


def large_modules(root: Path) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for path in (root / "epycd").rglob("*.py")
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES
    }


def test_no_new_large_module() -> None:
    new = large_modules(REPO) - KNOWN_LARGE
    assert not new, f"over {MAX_MODULE_LINES} lines, split them: {sorted(new)}"


def test_every_known_large_module_is_still_large() -> None:
    gone = KNOWN_LARGE - large_modules(REPO)
    assert not gone, (
        f"delete these from KNOWN_LARGE, they are {MAX_MODULE_LINES} lines or less (or gone): "
        f"{sorted(gone)}"
    )


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
