"""The plan views: each engine's `PlanView` is `VIEW` in its package's `cli.py`
(`epycd.engines.base.Engine.implementation`). Nothing here names an engine."""

from __future__ import annotations

from epycd import engines
from epycd.cli.engine_view import PlanView


def view_for(engine: str) -> PlanView:
    return engines.engine_named(engine).implementation("cli", "VIEW", PlanView)


def views() -> list[PlanView]:
    """Every registered engine's view."""
    return [view_for(engine.name) for engine in engines.ENGINES]
