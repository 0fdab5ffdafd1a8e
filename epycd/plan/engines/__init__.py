"""The engine planners: each engine's `EnginePlanner` is `PLANNER` in its package's
`plan/engines/planner.py` (`epycd.engines.base.Engine.implementation`), found by the endpoint file's
`engine`. Nothing here names an engine."""

from __future__ import annotations

from epycd import engines
from epycd.plan.engines.planner import EnginePlanner


def planner_for(engine: str) -> EnginePlanner:
    """The planner of the engine an endpoint file names (the file's `engine` is checked
    against the registered engines when it is read)."""
    return engines.engine_named(engine).implementation("plan.planner", "PLANNER", EnginePlanner)


def planners() -> list[EnginePlanner]:
    """Every registered engine's planner."""
    return [planner_for(engine.name) for engine in engines.ENGINES]
