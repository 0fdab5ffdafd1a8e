"""The registry of engine planners: one `EnginePlanner` per engine of `epycd.engines`,
found by the endpoint file's `engine`."""

from __future__ import annotations

from epycd.engines.llama_cpp.plan.planner import PLANNER as LLAMA_CPP_PLANNER
from epycd.engines.vllm.plan.planner import PLANNER as VLLM_PLANNER
from epycd.plan.planner import EnginePlanner

PLANNERS: dict[str, EnginePlanner] = {p.engine: p for p in (VLLM_PLANNER, LLAMA_CPP_PLANNER)}


def planner_for(engine: str) -> EnginePlanner:
    """The planner of the engine an endpoint file names (the file's `engine` is checked
    against the registered engines when it is read)."""
    return PLANNERS[engine]
