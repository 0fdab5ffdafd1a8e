"""An endpoint file made ready for placement (`Prepared`: its route, model facts and
warnings) and what preparing reads from the outside world (`Sources`). Every engine's
planner (`epycd.plan.engines.planner.EnginePlanner`) prepares into this one type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from epycd.errors import Refusal
from epycd.host.facts import HostVllmFacts
from epycd.model.facts import ModelFacts
from epycd.plan.model import EngineChoice
from epycd.plan.route import EngineRoute
from epycd.settings import Settings
from epycd.spec import EndpointSpec, SpecResult

ModelInspector = Callable[..., ModelFacts]
"""`inspect_model`'s signature: a model id or path and its keyword options."""

VllmProber = Callable[[str], HostVllmFacts]
"""A vllm executable -> what it is (`ProbeCache.probe`)."""

RouteT = TypeVar("RouteT", bound=EngineRoute)


@dataclass(frozen=True)
class Sources:
    """What preparing asks the outside world, each once per model or executable in one
    planning run (`epycd.plan.pipeline.prepare.memoized_sources`)."""

    inspect: ModelInspector
    probe_vllm: VllmProber
    settings: Settings | None = None
    """Where an engine's own files are (a converted model's GGUF); None: the defaults."""


@dataclass
class Prepared:
    """An endpoint whose file, route and model passed: ready for placement and sizing."""

    result: SpecResult
    spec: EndpointSpec
    route: EngineRoute
    facts: ModelFacts
    warnings: list[str] = field(default_factory=list)
    host_vllm: HostVllmFacts | None = None
    """The host vLLM it runs on the host path, as probed (with its interpreter's headers)."""
    engine_choice: EngineChoice | None = None
    """Why its engine serves it (`engine = "auto"`, a converted model); None otherwise."""

    def route_of(self, kind: type[RouteT]) -> RouteT:
        """The route as its engine's own type: an engine's stages are never given another's."""
        if not isinstance(self.route, kind):
            raise TypeError(f"{self.result.name}: a {type(self.route).__name__}, not {kind}")
        return self.route


class Prerequisite(BaseModel):
    """An input an endpoint's plan needs that approve makes before it plans: the GGUF file
    of a safetensors model a llama.cpp endpoint serves (docs/conversion.md). The engine
    that asked makes it (`epycd.approval.prerequisites`)."""

    model_config = ConfigDict(frozen=True)

    action: Literal["convert"] = "convert"
    engine: str
    endpoint: str
    model: str
    revision: str | None
    quantize: str
    output: str
    hf_token_file: str | None = None
    """The endpoint's root-only token file, for a gated model's download (a path, not the
    token)."""


class MissingPrerequisite(Refusal):
    """The endpoint is planned once approve has made `prerequisite`; `pooling`: the model is
    an embedder or a reranker, as its source's facts say (`engine = "auto"` chooses by it)."""

    def __init__(
        self,
        prerequisite: Prerequisite,
        message: str,
        *,
        file: Path,
        fix: str,
        pooling: bool = False,
    ) -> None:
        super().__init__(message, file=file, key="model", fix=fix)
        self.prerequisite = prerequisite
        self.pooling = pooling
