"""The server renderers: each engine's `ServerRenderer` is `RENDERER` in its package's
`render.py` (`epycd.engines.base.Engine.implementation`), found by the decisions' `engine`.
Nothing here names an engine."""

from __future__ import annotations

from epycd import engines
from epycd.render.server import ServerRenderer


def renderer_for(engine: str) -> ServerRenderer:
    return engines.engine_named(engine).implementation("render", "RENDERER", ServerRenderer)
