"""The planner asks each endpoint's engine (`epycd.plan.engines`): every registered engine
has a planner, and in one planning run of both engines' endpoints, one server and a set laid out
by trial fits (`instances = "auto"`),
each planner prepares, tries and decides its own endpoints and no other's."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from epycd.engines import ENGINES as REGISTERED
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import server_types, shared_fields
from epycd.plan.engines import planners
from epycd.plan.model import EndpointService, EngineService
from tests.engines.endpoints import ENGINES, endpoint_text
from tests.plan.conftest import PlanWorkspace

HostOf = Callable[..., HostFacts]


def test_every_registered_engine_has_a_planner_of_its_own() -> None:
    found = planners()
    assert [p.engine for p in found] == [e.name for e in REGISTERED]
    assert sorted(e.name for e in REGISTERED) == sorted(ENGINES)
    for kind, server_type in server_types().items():
        [service] = [b for b in server_type.__mro__[1:] if _engine_service(b)]
        assert issubclass(service, EngineService)
        overlap = set(service.model_fields) & set(EndpointService.model_fields)
        assert not overlap, (kind, overlap)
        assert shared_fields(server_type) == set(EndpointService.model_fields) | set(
            service.model_fields
        ), kind


def _engine_service(base: type) -> bool:
    """An engine's own service: what its servers share, beside every endpoint's fields."""
    return issubclass(base, EngineService) and bool(vars(base).get("__annotations__"))


def spy_on_planners(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[str, str]]]:
    """engine -> (method, endpoint name) for each call of its planner's stages."""
    calls: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for planner in planners():
        engine = planner.engine
        for method in ("prepare", "fits", "decide", "unfit"):
            real = getattr(planner, method)

            def spy(first: Any, *args: Any, _e: str = engine, _m: str = method, _r: Any = real,
                    **kwargs: Any) -> Any:  # fmt: skip
                name = first.name if _m == "prepare" else first.result.name
                calls[_e].append((_m, name))
                return _r(first, *args, **kwargs)

            monkeypatch.setattr(planner, method, spy)
    return calls


def test_each_endpoint_is_planned_by_its_engines_planner_alone(
    ws: PlanWorkspace, host_of: HostOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine_of: dict[str, str] = {}
    for engine in ENGINES:
        slug = engine.replace(".", "-")
        for shape in ("one", "set"):
            auto = 'instances = "auto"\n' if shape == "set" else ""
            ws.endpoint(f"{slug}-{shape}", endpoint_text(ws.tmp, engine, "one") + auto)
            engine_of[f"{slug}-{shape}"] = engine
    calls = spy_on_planners(monkeypatch)
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    for name, result in results.items():
        assert result.plan is not None, (name, [e.text for e in result.errors])
        servers = list(result.plan.decisions.servers)
        assert (len(servers) > 1) == name.endswith("set"), (name, len(servers))
        assert {s.engine for s in servers} == {engine_of[name]}, name
    for engine in ENGINES:
        names = {name for _, name in calls[engine]}
        assert names == {n for n, e in engine_of.items() if e == engine}, (engine, calls[engine])
        assert {m for m, _ in calls[engine]} >= {"prepare", "fits", "decide"}, calls[engine]
