"""Model formats, each read by the engine that serves it (`ModelFormat`).

Every engine implements its format as `FORMAT` in its package's `model/format.py` and names
it in `Engine.model_format`: a GGUF file is llama.cpp's, a Hugging Face model (a folder or
hub repository of config.json and safetensors) vLLM's. One format takes what no other holds
(`catch_all`). `inspect_model` gives each model to the format that holds it, with every other
engine's answer on it (`elsewhere`). No module here names an engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from epycd import engines
from epycd.model.facts import EngineSupport, ModelFacts, Support

if TYPE_CHECKING:
    from epycd.host.probe_cache import ProbeCache


@dataclass(frozen=True)
class InspectRequest:
    """A model to read, and what the caller knows of how to read it."""

    model: str
    """A hub id, an absolute folder or a model file, as the endpoint file gives it."""
    file: str | None = None
    """The model file inside a hub repository or folder (the endpoint file's `gguf_file`)."""
    revision: str | None = None
    token: str | None = None
    chat_template_override: str | None = None
    engine_version: str | None = None
    """The version of the catch-all format's engine to judge by (its route's, or
    `check-model --vllm-version`); None: its pinned one."""
    engine_executable: str | None = None
    """That engine, installed, to ask instead of the tables (its route's executable)."""
    probe_cache: ProbeCache | None = None


class ModelFormat(ABC):
    """One engine's model format."""

    engine: ClassVar[str]
    name: ClassVar[str]
    """`ModelFacts.format` of a model in it."""
    catch_all: ClassVar[bool] = False
    """It holds every model that no other format holds (one format does)."""

    @abstractmethod
    def holds(self, request: InspectRequest) -> bool:
        """Whether the model is in this format."""

    @abstractmethod
    def inspect(self, request: InspectRequest, others: list[EngineSupport]) -> ModelFacts:
        """The model's facts, with its engine's answer after `others` (every other engine's,
        `elsewhere`)."""

    @abstractmethod
    def elsewhere(self, holder: ModelFormat, request: InspectRequest) -> EngineSupport:
        """Its engine's answer on a model in `holder`'s format: unsupported, and the fix."""


def model_formats() -> list[ModelFormat]:
    """Every registered engine's format, in the registry's order."""
    return [
        engine.implementation("model.format", "FORMAT", ModelFormat)
        for engine in engines.ENGINES
        if engine.model_format is not None
    ]


def format_of(request: InspectRequest) -> ModelFormat:
    """The format the model is in: the first that holds it, the catch-all last."""
    formats = sorted(model_formats(), key=lambda f: f.catch_all)
    held = next((f for f in formats if f.holds(request)), None)
    if held is None:
        raise LookupError(f"no registered model format holds {request.model}")
    return held


def format_named(name: str) -> ModelFormat | None:
    """The format of that `ModelFacts.format`."""
    return next((f for f in model_formats() if f.name == name), None)


def in_engines_own_format(facts: ModelFacts) -> bool:
    """Whether the model is in a format one engine reads by itself (a GGUF file), not the
    catch-all's (a Hugging Face model, which `ModelFacts.support` speaks of)."""
    own = format_named(facts.format)
    return own is not None and not own.catch_all


def in_registry_order(answers: list[EngineSupport]) -> list[EngineSupport]:
    """Each engine's answer in the order the registry lists the engines."""
    order = [engine.name for engine in engines.ENGINES]
    return sorted(answers, key=lambda answer: order.index(answer.engine))


def catch_all_support(others: list[EngineSupport]) -> Support:
    """`ModelFacts.support` of a model in an engine's own format: the catch-all format's
    engine's answer among `others`, in `Support`'s terms."""
    engine = next(f.engine for f in model_formats() if f.catch_all)
    answer = next(a for a in others if a.engine == engine)
    return Support(
        supported=answer.supported,
        kind=answer.kind,
        vllm_version=answer.version,
        table_version=None,
    )
