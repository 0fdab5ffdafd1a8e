"""What an engine's approved endpoint needs of the host beyond the shape the plan was made
on, checked by the boot check (`epycd.approval.check`) before each start: `BOOT_CHECK`, an
`EngineBootCheck`, in the engine's package's `approval.py`; an engine without one needs
nothing more (`NOTHING_MORE`)."""

from __future__ import annotations

from pathlib import Path

from epycd.engines import engine_named
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import Plan


class EngineBootCheck:
    """One engine's boot-time check of an approved endpoint; the base needs nothing."""

    def problems(self, plan: Plan, host: HostFacts, root: Path) -> list[str]:
        """Each reason the approved endpoint must not start on `host` (read from `root`),
        naming what changed and the fix."""
        return []


NOTHING_MORE = EngineBootCheck()


def engine_check(plan: Plan) -> EngineBootCheck:
    """The boot check of the plan's engine."""
    engine = engine_named(plan.decisions.engine)
    return engine.implementation("approval", "BOOT_CHECK", EngineBootCheck, NOTHING_MORE)
