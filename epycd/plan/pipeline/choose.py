"""The engine of an endpoint file that says `engine = "auto"` (docs/tuning.md rule 12): the
engines in the order its profile prefers them (`PREFERRED`), and the first whose planner
prepares the endpoint serves it. One that cannot (its runtime is not installed, the model is
not of its format and cannot be converted, its architecture is unknown to it) is passed over
with its reason, which the plan shows beside the rule's.

An engine that could serve the endpoint once approve has made an input for it (llama.cpp, a
safetensors model not converted yet: `MissingPrerequisite`) is chosen all the same: approve
converts, then plans again."""

from __future__ import annotations

import dataclasses

from epycd import engines
from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.plan.engines import planner_for
from epycd.plan.model import EngineChoice
from epycd.plan.prepared import MissingPrerequisite, Prepared, Sources
from epycd.spec import SpecResult
from epycd.spec.key_setting import AUTO_ENGINE
from epycd.stack import Stack

PREFERRED: dict[str, tuple[str, ...]] = {
    "latency": ("llama.cpp", "vllm"),
    "balanced": ("llama.cpp", "vllm"),
    "throughput": ("vllm", "llama.cpp"),
}
"""Each profile's engines, best first, by the measurements of
benchmarks/llama-serving-results.md (runs 6-9: the same ~100M model, the same 2 cores)."""
WHY: dict[str, str] = {
    "latency": "profile latency, one user at a time: llama.cpp served 2.5-3.9x vLLM's "
    "tokens/s at concurrency 1, started in 0.3 s against 85 s, in a tenth of the memory",
    "balanced": "profile balanced, a few users at once: llama.cpp led at concurrency 1 and "
    "8 (414 against 268 tok/s at 8), started in 0.3 s against 85 s, in a tenth of the memory",
    "throughput": "profile throughput, many users at once: vLLM batches up to 256 sequences "
    "and led at concurrency 32 (411 against 263-334 tok/s, first token 1.5 s against 6-7 s)",
}


def engine_order(profile: str) -> tuple[str, ...]:
    """The profile's engines, then any other registered engine in registry order."""
    preferred = PREFERRED[profile]
    registered = tuple(e.name for e in engines.ENGINES)
    return (
        *(name for name in preferred if name in registered),
        *(name for name in registered if name not in preferred),
    )


def prepare_auto(
    result: SpecResult,
    host: HostFacts,
    stack: Stack,
    sources: Sources,
    secret_group: int | None,
) -> Prepared:
    """The endpoint prepared by the first engine of its profile's order that can serve it;
    the last engine's error when none can."""
    spec = result.spec
    assert spec is not None and spec.engine == AUTO_ENGINE
    passed_over: list[str] = []
    last: EpycError | None = None
    for name in engine_order(spec.profile):
        as_engine = dataclasses.replace(result, spec=spec.model_copy(update={"engine": name}))
        try:
            prepared = planner_for(name).prepare(as_engine, host, stack, sources, secret_group)
        except MissingPrerequisite as waiting:
            waiting.message += f' (engine = "auto" chose {name}: {WHY[spec.profile]})'
            raise
        except EpycError as exc:
            to_serve = f" (to serve with it: {exc.fix})" if exc.fix else ""
            passed_over.append(f"not {name}: {exc.message}{to_serve}")
            last = exc
            continue
        return _chosen(prepared, [f"{name}: {WHY[spec.profile]}", *passed_over])
    assert last is not None, "every registry has an engine"
    last.message = 'no engine can serve it (engine = "auto"): ' + "; ".join(passed_over)
    raise last


def _chosen(prepared: Prepared, reasons: list[str]) -> Prepared:
    own = prepared.engine_choice
    choice = EngineChoice(
        asked=AUTO_ENGINE,
        reasons=[*reasons, *(own.reasons if own else [])],
        converted=own.converted if own else None,
    )
    return dataclasses.replace(prepared, engine_choice=choice)
