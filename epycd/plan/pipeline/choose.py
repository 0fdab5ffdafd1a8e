"""The engine of an endpoint file that says `engine = "auto"` (docs/tuning.md rule 12): the
engines in the order its profile prefers them on the CPU's instruction set (`PREFERRED`:
AVX-512, or AVX2 alone, where vLLM's CPU path is its limited one), and the first whose planner
prepares the endpoint serves it. One that cannot (its runtime is not installed, the model is
not of its format and cannot be converted, its architecture is unknown to it) is passed over
with its reason, which the plan shows beside the rule's. A key the file sets that only some
engines read (`quantize`: llama.cpp) puts those engines first, whatever the profile. An
embedder or a reranker (a pooling model, known once an engine has read it) has orders of
its own (`POOLING`): the first choice is made again in its profile's.

An engine that could serve the endpoint once approve has made an input for it (llama.cpp, a
safetensors model not converted yet: `MissingPrerequisite`) is chosen all the same: approve
converts, then plans again."""

from __future__ import annotations

import dataclasses

from epycd import engines
from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.plan.engines import planner_for
from epycd.plan.isa import AVX2_MEASURED, AVX2_SPAN, InstructionSet, instruction_set
from epycd.plan.model import EngineChoice
from epycd.plan.prepared import MissingPrerequisite, Prepared, Sources
from epycd.spec import EndpointSpec, SpecResult
from epycd.spec.key_setting import AUTO_ENGINE, ENGINES
from epycd.spec.keys import keys
from epycd.stack import Stack

AVX512_PREFERRED: dict[str, tuple[str, ...]] = {
    "latency": ("llama.cpp", "vllm"),
    "balanced": ("llama.cpp", "vllm"),
    "throughput": ("vllm", "llama.cpp"),
    "pooling-latency": ("llama.cpp", "vllm"),
    "pooling": ("vllm", "llama.cpp"),
}
"""Each profile's engines, best first, on a CPU with AVX-512, by the measurements of
benchmarks/llama-serving-results.md (runs 6-9) and benchmarks/auto-engine-results.md (runs 1
and 2): the same ~100M model on the same 2 cores; a pooling model's (`POOLING`), by
benchmarks/pooling-serving-results.md (run 7: a published embedder on both engines, vLLM's
matrix products held to an EPYC's instructions)."""
AVX2_PREFERRED: dict[str, tuple[str, ...]] = dict.fromkeys(AVX512_PREFERRED, ("llama.cpp", "vllm"))
"""Every rule's engines on a CPU without AVX-512: llama.cpp first, by
benchmarks/auto-engine-results.md run 3 (a Milan, Zen 3, 2 cores: vLLM's AVX2 path served
a fraction of llama.cpp's tokens/s at every profile's concurrency: `AVX2_MEASURED`)."""
PREFERRED: dict[InstructionSet, dict[str, tuple[str, ...]]] = {
    "avx512": AVX512_PREFERRED,
    "avx2": AVX2_PREFERRED,
}
POOLING: dict[str, str] = {
    "latency": "pooling-latency",
    "balanced": "pooling",
    "throughput": "pooling",
}
"""The rule of an embedder or a reranker under each profile."""


def _avx2_why(profile: str) -> str:
    m = AVX2_MEASURED[profile]
    return (
        f"profile {profile}, no AVX-512 on this CPU: vLLM runs its AVX2 path, which on a Milan "
        f"(Zen 3, 2 cores) served {m.vllm} tok/s against llama.cpp's {m.llama_cpp:g} at "
        f"concurrency {m.concurrency} ({m.times}x)"
    )


def _avx2_pooling_why(who: str) -> str:
    return (
        f"an embedder or reranker, {who}, no AVX-512 on this CPU: llama.cpp, whose AVX2 "
        f"kernels are its main ones (vLLM's AVX2 path served text {AVX2_SPAN} slower on a "
        "Milan; an embedder not yet measured there)"
    )


WHY: dict[InstructionSet, dict[str, str]] = {
    "avx512": {
        "latency": "profile latency, one user at a time: llama.cpp served 2.5-3.9x vLLM's "
        "tokens/s at concurrency 1, started in 0.3 s against 85 s, in a tenth of the memory",
        "balanced": "profile balanced, a few users at once: llama.cpp led at concurrency 1 "
        "and 8 (414 against 268 tok/s at 8), started in 0.3 s against 85 s, in a tenth of the "
        "memory",
        "throughput": "profile throughput, many users at once: vLLM batches up to 256 "
        "sequences; at concurrency 32 it served as many tokens/s as llama.cpp on q8_0 (545 "
        "against 553-607) and answered first in 1.1 s against 7.8-8.6 s",
        "pooling-latency": "an embedder or reranker, profile latency: on all-MiniLM-L6-v2 "
        "llama.cpp answered one user as fast as vLLM (35-37 against 36 requests/s), started "
        "in 0.3 s against a minute, in a fraction of the memory",
        "pooling": "an embedder or reranker, several users at once: on all-MiniLM-L6-v2 vLLM "
        "ran the inputs of 8 and of 32 users in one step, 1.4x and 1.5x llama.cpp's "
        "requests/s (52.0 and 57.2 against 37.2 and 37.3)",
    },
    "avx2": {
        **{profile: _avx2_why(profile) for profile in AVX2_MEASURED},
        "pooling-latency": _avx2_pooling_why("profile latency"),
        "pooling": _avx2_pooling_why("several users at once"),
    },
}


def engine_order(
    rule: str, asked: tuple[str, ...] = (), isa: InstructionSet = "avx512"
) -> tuple[str, ...]:
    """The engines the file's own keys ask for (`asked_by_keys`), then the rule's (a
    profile's, or `POOLING`) on the CPU's instruction set, then any other registered engine
    in registry order."""
    registered = tuple(e.name for e in engines.ENGINES)
    preferred = [name for name in PREFERRED[isa][rule] if name in registered]
    every = list(dict.fromkeys((*preferred, *registered)))
    return (*(n for n in every if n in asked), *(n for n in every if n not in asked))


def asked_by_keys(spec: EndpointSpec) -> tuple[list[str], tuple[str, ...]]:
    """The keys the file sets that only some engines read (`quantize`: llama.cpp), and the
    engines that read them all: the file asks for those engines whatever its profile, since
    another would serve it without what those keys say."""
    given = [
        row
        for row in keys()
        if row.name in spec.model_fields_set
        and AUTO_ENGINE in row.engines
        and not set(ENGINES) <= set(row.engines)
    ]
    if not given:
        return [], ()
    reading = tuple(name for name in ENGINES if all(name in row.engines for row in given))
    return [row.name for row in given], reading


def prepare_auto(
    result: SpecResult,
    host: HostFacts,
    stack: Stack,
    sources: Sources,
    secret_group: int | None,
) -> Prepared:
    """The endpoint prepared by the first engine of its profile's order that can serve it;
    for a pooling model (known from the first engine's reading, or from the source the
    conversion it waits for would read), by the first of its profile's `POOLING` order; the
    last engine's error when none can."""
    spec = result.spec
    assert spec is not None and spec.engine == AUTO_ENGINE
    try:
        first = _first_serving(result, spec.profile, host, stack, sources, secret_group)
    except MissingPrerequisite as waiting:
        if not waiting.pooling:
            raise
    else:
        if not first.facts.pooling:
            return first
    return _first_serving(result, POOLING[spec.profile], host, stack, sources, secret_group)


def _first_serving(
    result: SpecResult,
    rule: str,
    host: HostFacts,
    stack: Stack,
    sources: Sources,
    secret_group: int | None,
) -> Prepared:
    """The endpoint prepared by the first engine of `rule`'s order (a profile, or
    `POOLING`) that can serve it, with the reasons."""
    spec = result.spec
    assert spec is not None
    passed_over: list[str] = []
    last: EpycError | None = None
    named, asked = asked_by_keys(spec)
    isa = instruction_set(host)
    for name in engine_order(rule, asked, isa):
        why = (
            f"the file sets {', '.join(named)}, which {name} reads"
            if name in asked
            else WHY[isa][rule] + (f" (it does not read {', '.join(named)})" if named else "")
        )
        as_engine = dataclasses.replace(result, spec=spec.model_copy(update={"engine": name}))
        try:
            prepared = planner_for(name).prepare(as_engine, host, stack, sources, secret_group)
        except MissingPrerequisite as waiting:
            waiting.message += f' (engine = "auto" chose {name}: {why})'
            raise
        except EpycError as exc:
            to_serve = f" (to serve with it: {exc.fix})" if exc.fix else ""
            passed_over.append(f"not {name}: {exc.message}{to_serve}")
            last = exc
            continue
        return _chosen(prepared, [f"{name}: {why}", *passed_over])
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
