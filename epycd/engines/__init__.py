"""The registry of engines: every engine epycd can serve with, one package each behind
`epycd.engines.base.Engine`. Core code finds an engine here, by its name or by what its
server answers, and never names one. Beside the two built in, an engine installed from a
distribution of its own is found by its `epycd.engines` entry point
(docs/adding-an-engine.md)."""

from __future__ import annotations

from importlib.metadata import entry_points

from epycd.engines.base import Engine, ServerMetrics
from epycd.engines.llama_cpp import LLAMA_CPP
from epycd.engines.vllm import VLLM

ENTRY_POINTS = "epycd.engines"
"""The entry-point group of installed engines: NAME = "package:ENGINE", an `Engine`."""


def installed_engines() -> tuple[Engine, ...]:
    """The engines installed from distributions of their own, in the order Python finds them."""
    found = []
    for point in entry_points(group=ENTRY_POINTS):
        engine = point.load()
        if not isinstance(engine, Engine) or engine.name != point.name:
            raise TypeError(f"the {ENTRY_POINTS} entry point {point.name} is no Engine of its name")
        found.append(engine)
    return tuple(found)


ENGINES: tuple[Engine, ...] = (VLLM, LLAMA_CPP, *installed_engines())
DEFAULT_ENGINE = VLLM
"""The engine of an endpoint file that names none, and of a supervisor not told one."""

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "ServerMetrics",
    "api_key_variables",
    "engine_exporting",
    "engine_named",
    "metric_prefixes",
]


def engine_named(name: str) -> Engine:
    """The engine an endpoint file or a plan names; KeyError for none."""
    for engine in ENGINES:
        if engine.name == name:
            return engine
    raise KeyError(name)


def engine_exporting(exposition: str) -> Engine | None:
    """The engine whose running-requests gauge a /metrics exposition holds; None for none."""
    return next((e for e in ENGINES if e.metrics.running in exposition), None)


def metric_prefixes() -> tuple[str, ...]:
    """Every engine's own families' prefix."""
    return tuple(e.metrics.prefix for e in ENGINES)


def api_key_variables() -> list[str]:
    return [e.api_key_env for e in ENGINES]
