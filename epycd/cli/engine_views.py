"""The registry of plan views: one `PlanView` per engine of `epycd.engines`."""

from __future__ import annotations

from epycd.cli.engine_view import PlanView
from epycd.engines.llama_cpp.cli import VIEW as LLAMA_CPP_VIEW
from epycd.engines.vllm.cli import VIEW as VLLM_VIEW

VIEWS: dict[str, PlanView] = {v.engine: v for v in (VLLM_VIEW, LLAMA_CPP_VIEW)}


def view_for(engine: str) -> PlanView:
    return VIEWS[engine]
