"""The registry of server renderers: one `ServerRenderer` per engine of `epycd.engines`,
found by the decisions' `engine`."""

from __future__ import annotations

from epycd.engines.llama_cpp.render import RENDERER as LLAMA_CPP_RENDERER
from epycd.engines.vllm.render import RENDERER as VLLM_RENDERER
from epycd.render.server import ServerRenderer

RENDERERS: dict[str, ServerRenderer] = {r.engine: r for r in (VLLM_RENDERER, LLAMA_CPP_RENDERER)}


def renderer_for(engine: str) -> ServerRenderer:
    return RENDERERS[engine]
