"""One endpoint file's outcome (`EndpointResult`): its plan, or its errors and how far
planning got; how an endpoint's error is reported against its endpoint file; the result of
an endpoint whose planning raised what no rule foresaw (`crashed`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SerializeAsAny

from epycd.errors import EpycError, unexpected_error
from epycd.model.facts import ModelFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.prepared import Prerequisite
from epycd.plan.problem import Problem
from epycd.plan.route import EngineRoute
from epycd.spec import SpecResult


class EndpointResult(BaseModel):
    """One endpoint file's outcome: a plan, or the errors (and how far planning got)."""

    endpoint: str
    config_file: str
    plan: Plan | None = None
    decisions: EndpointDecisions | None = Field(
        default=None, description="when refused after sizing (e.g. does not fit)"
    )
    model_facts: ModelFacts | None = None
    route: SerializeAsAny[EngineRoute] | None = Field(
        default=None, description="when refused after routing (its engine's route)"
    )
    errors: list[Problem] = Field(default_factory=list)
    unfit_inputs_fingerprint: str | None = Field(
        default=None,
        description="when refused only because memory free now is short: the inputs "
        "fingerprint, so an approved endpoint whose inputs did not change is not drift",
    )
    prerequisite: Prerequisite | None = Field(
        default=None,
        description="what approve makes before this endpoint can be planned (its model "
        "converted to GGUF); the plan is refused until then",
    )
    unreadable_here: str | None = Field(
        default=None,
        description="a root-only file (the token file) this non-root caller cannot read: "
        "the plan cannot be made here, which says nothing about drift",
    )

    @property
    def exit_code(self) -> int:
        if not self.errors:
            return 0
        return max(problem.exit_code for problem in self.errors)


def against_endpoint_file(exc: EpycError, file: Path) -> None:
    """Report an endpoint's error against its endpoint file: one about another file the file
    names (the model folder or its config.json, a chat template) keeps that file in its
    message and names the key (`model` where the error has none). The exit code stays."""
    if exc.file is not None and exc.file != str(file):
        exc.message = f"{exc.file}: {exc.message}"
        exc.key = exc.key or "model"
    exc.file = str(file)


def failed(result: SpecResult, *errors: EpycError, **extra: object) -> EndpointResult:
    return EndpointResult(
        endpoint=result.name,
        config_file=str(result.path),
        errors=[Problem.of(exc) for exc in errors],
        **extra,
    )


def crashed(result: SpecResult, exc: Exception, doing: str) -> EndpointResult:
    """The planning boundary: an endpoint whose planning raised what no rule foresaw is
    refused with one line of its own (`unexpected_error`: the traceback to the journal),
    built from its name and file alone so that this result cannot fail as well."""
    return EndpointResult(
        endpoint=result.name,
        config_file=str(result.path),
        errors=[Problem.of(unexpected_error(exc, file=result.path, doing=doing))],
    )
