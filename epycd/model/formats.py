"""Model formats an engine reads by itself (`ModelFormat`).

A Hugging Face model (a folder or hub repository of config.json and safetensors) is read by
`epycd.model.check` as vLLM reads it. An engine that serves another format (a GGUF file)
implements `ModelFormat` as `FORMAT` in its package's `model/format.py` and names the format
in `Engine.model_format`; `inspect_model` gives it every model of that format, and asks it
what its engine says of a model of another format. No module here names an engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from epycd import engines
from epycd.model.facts import EngineSupport, ModelFacts, Support


class ModelFormat(ABC):
    """One engine's own model format."""

    engine: ClassVar[str]
    name: ClassVar[str]
    """`ModelFacts.format` of a model in it."""
    vllm_refusal: ClassVar[str]
    """Why vLLM's CPU backend cannot load it, for vLLM's answer on such a model."""

    @abstractmethod
    def holds(self, model: str, file: str | None) -> bool:
        """Whether `model` (with the endpoint file's `gguf_file`, `file`) is in this format."""

    @abstractmethod
    def inspect(
        self,
        model: str,
        *,
        file: str | None,
        revision: str | None,
        chat_template_override: str | None,
        others: list[EngineSupport],
        support: Support,
    ) -> ModelFacts:
        """The model's facts: its engine's answer after `others` (every other engine's), and
        `support`, vLLM's answer in vLLM's terms (the facts' `support`)."""

    @abstractmethod
    def elsewhere(self) -> EngineSupport:
        """Its engine's answer on a model of another format: unsupported, and the fix."""


def model_formats() -> list[ModelFormat]:
    """Every registered engine's own format, in the registry's order."""
    return [
        engine.implementation("model.format", "FORMAT", ModelFormat)
        for engine in engines.ENGINES
        if engine.model_format is not None
    ]


def format_of(model: str, file: str | None) -> ModelFormat | None:
    """The engine's format `model` is in; None for a Hugging Face model."""
    return next((f for f in model_formats() if f.holds(model, file)), None)


def format_named(name: str) -> ModelFormat | None:
    """The engine's format of that `ModelFacts.format`; None for a Hugging Face model's."""
    return next((f for f in model_formats() if f.name == name), None)


def in_registry_order(answers: list[EngineSupport]) -> list[EngineSupport]:
    """Each engine's answer in the order the registry lists the engines."""
    order = [engine.name for engine in engines.ENGINES]
    return sorted(answers, key=lambda answer: order.index(answer.engine))
