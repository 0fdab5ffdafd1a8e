"""What approve makes before it can plan an endpoint (`Prerequisite`: a safetensors model
converted to GGUF for llama.cpp), made by the engine that asked for it: `PREREQUISITES`, a
`PrerequisiteMaker`, in the engine's package's `approval.py`."""

from __future__ import annotations

from collections.abc import Callable

from epycd.engines import engine_named
from epycd.errors import Refusal
from epycd.plan.prepared import Prerequisite
from epycd.settings import Settings

Say = Callable[[str], None]


class PlanChanged(Refusal):
    """Making the prerequisite failed for good, and the failure is recorded where the planner
    reads it: the endpoint's plan is another now (`engine = "auto"` chooses another engine),
    so approve plans it again and shows that plan instead of stopping."""


class PrerequisiteMaker:
    """One engine's maker of the inputs its plans wait for; the base makes none."""

    def make(self, prerequisite: Prerequisite, settings: Settings, say: Say) -> None:
        raise NotImplementedError(f"{prerequisite.engine} makes no {prerequisite.action}")

    def describe(self, prerequisite: Prerequisite) -> str:
        """What making it does, for the question approve asks before it."""
        return f"{prerequisite.action} {prerequisite.model}"


NONE = PrerequisiteMaker()


def maker_for(prerequisite: Prerequisite) -> PrerequisiteMaker:
    engine = engine_named(prerequisite.engine)
    return engine.implementation("approval", "PREREQUISITES", PrerequisiteMaker, NONE)


def make_prerequisite(prerequisite: Prerequisite, settings: Settings, say: Say) -> None:
    """Make what the endpoint's plan waits for; an `EpycError` when it cannot be made, with
    nothing half-made left."""
    maker_for(prerequisite).make(prerequisite, settings, say)
