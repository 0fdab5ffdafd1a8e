"""Each stage finds an engine's implementation of it in the engine's package, by name
(`Engine.implementation`): every registered engine has each one, of the stage's type and
for itself; a name that is there but of another type is refused, and the stages' registries
import no engine."""

from __future__ import annotations

import ast
from importlib import import_module
from pathlib import Path

import pytest

from epycd.cli.engine_view import PlanView
from epycd.cli.engine_views import view_for, views
from epycd.engines import ENGINES, Engine
from epycd.plan.engines import planner_for, planners
from epycd.plan.engines.planner import EnginePlanner
from epycd.render.engines import renderer_for
from epycd.render.server import ServerRenderer
from tests.sandbox import REPO

REGISTRIES = (
    "epycd/plan/engines/__init__.py",
    "epycd/render/engines.py",
    "epycd/cli/engine_views.py",
    "epycd/export/__init__.py",
)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_each_engine_implements_each_stage_for_itself(engine: Engine) -> None:
    assert engine.package.startswith("epycd.engines.")
    planner, renderer, view = (
        planner_for(engine.name),
        renderer_for(engine.name),
        view_for(engine.name),
    )
    assert isinstance(planner, EnginePlanner) and planner.engine == engine.name
    assert isinstance(renderer, ServerRenderer) and renderer.engine == engine.name
    assert isinstance(view, PlanView) and view.engine == engine.name
    assert planner_for(engine.name) is planner, "one planner per engine, not one per call"


def test_the_registries_list_the_registered_engines_in_order() -> None:
    assert [p.engine for p in planners()] == [e.name for e in ENGINES]
    assert [v.engine for v in views()] == [e.name for e in ENGINES]


def test_a_name_of_another_type_is_refused_naming_it() -> None:
    engine = ENGINES[0]
    with pytest.raises(TypeError, match=rf"{engine.package}\.render\.RENDERER is no EnginePlanner"):
        engine.implementation("render", "RENDERER", EnginePlanner)
    with pytest.raises(KeyError):
        planner_for("no-such-engine")


@pytest.mark.parametrize("registry", REGISTRIES)
def test_a_stage_registry_imports_no_engine(registry: str) -> None:
    tree = ast.parse(Path(REPO / registry).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("epycd.engines.")}, imported


def test_an_engine_without_a_bench_client_is_measured_by_epycds_own() -> None:
    """`BENCH` in an engine's cli.py where it has a client of its own (vLLM: `vllm bench
    serve` and an offline mode); epycd's client of the OpenAI API for any other."""
    from epycd.cli.bench import OPENAI_CLIENT, BenchClient, bench_client

    for engine in ENGINES:
        client = bench_client(engine.name)
        assert isinstance(client, BenchClient)
        own = vars(import_module(f"{engine.package}.cli")).get("BENCH")
        assert client is (own if own is not None else OPENAI_CLIENT)
    assert bench_client("vllm").offline and bench_client("vllm") is not OPENAI_CLIENT
    assert not OPENAI_CLIENT.offline


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_an_engine_has_a_kube_export_or_says_why_not(engine: Engine) -> None:
    """`EXPORTER` in its package's export/kube.py exactly where `no_kube_export` is None."""
    from epycd.export import KubeExporter

    try:
        module = import_module(f"{engine.package}.export.kube")
    except ModuleNotFoundError:
        exporter = None
    else:
        exporter = vars(module).get("EXPORTER")
    if engine.no_kube_export is None:
        assert isinstance(exporter, KubeExporter), engine.name
    else:
        assert exporter is None and engine.no_kube_export, engine.name


def test_a_stage_an_engine_may_leave_to_the_core_needs_no_module() -> None:
    """An engine without the stage's implementation gets the core's default (llama.cpp's
    approval module has no boot check), one with it its own (vLLM's); without a default, a
    missing module or name is an error, not a silent None."""
    from epycd.approval.engine_check import NOTHING_MORE, EngineBootCheck

    llama = next(e for e in ENGINES if e.name == "llama.cpp")
    found = llama.implementation("approval", "BOOT_CHECK", EngineBootCheck, NOTHING_MORE)
    assert found is NOTHING_MORE
    vllm = next(e for e in ENGINES if e.name == "vllm")
    assert vllm.implementation("approval", "BOOT_CHECK", EngineBootCheck, NOTHING_MORE) is not (
        NOTHING_MORE
    )
    with pytest.raises(TypeError, match="BOOT_CHECK is no EngineBootCheck"):
        llama.implementation("approval", "BOOT_CHECK", EngineBootCheck)
    with pytest.raises(ModuleNotFoundError):
        llama.implementation("export", "EXPORTER", EngineBootCheck)
