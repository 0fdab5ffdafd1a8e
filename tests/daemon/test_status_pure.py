"""The pure parts of status: systemctl's `show` output, the unit/supervisor matrix, the
STATUS= counts."""

from __future__ import annotations

import pytest

from epycd.approval.migrate import migrated_plan
from epycd.plan.endpoint import Plan
from epycd.status.handoff import handoff
from epycd.status.machine import EndpointStatus, counts_text, runtime_state
from epycd.status.units import UnitState, parse_show
from epycd.supervisor import SupervisorStatus
from tests.render.fixtures import as_plan, milan_docker

SHOW = """Id=epyc-llm-a.service
LoadState=loaded
ActiveState=failed
SubState=failed
Result=exit-code
UnitFileState=enabled

Id=epyc-llm-b.service
LoadState=not-found
ActiveState=inactive
SubState=dead
Result=success
UnitFileState=
"""


def test_parse_show_reads_every_block() -> None:
    units = parse_show(SHOW)
    assert units["epyc-llm-a.service"].active == "failed"
    assert units["epyc-llm-a.service"].result == "exit-code"
    assert units["epyc-llm-a.service"].known
    assert not units["epyc-llm-b.service"].known


def supervisor(state: str, phase: str | None = None) -> SupervisorStatus:
    return SupervisorStatus.model_validate(
        {"state": state, "name": "a", "url": "u", "model": "m", "phase": phase, "reason": "r"}
    )


@pytest.mark.parametrize(
    ("active", "said", "expected"),
    [
        ("active", None, "ready"),
        ("activating", supervisor("starting", "models"), "starting"),
        ("failed", supervisor("failed", "request"), "failed:request"),
        ("failed", supervisor("ready", "request"), "failed:start"),
        ("inactive", supervisor("ready", "request"), "approved"),
        ("unknown", supervisor("ready", "request"), "ready"),
        ("unknown", supervisor("failed", "health"), "failed:health"),
        ("unknown", None, "approved"),
    ],
)
def test_unit_and_supervisor_make_the_state(
    active: str, said: SupervisorStatus | None, expected: str
) -> None:
    unit = UnitState(unit="u", load="loaded" if active != "unknown" else "unknown", active=active)
    assert runtime_state(unit, said)[0] == expected


def test_counts_text() -> None:
    def status(state: str) -> EndpointStatus:
        return EndpointStatus(name=state, state=state, unit="u")

    states = ["ready", "ready", "pending-approval", "failed:health", "changed-needs-approval"]
    assert counts_text(status(s) for s in states) == (
        "2 ready, 1 failed, 1 needs approval, 1 changed, needs approval"
    )
    assert counts_text([]) == "no endpoints"


def test_the_handoff_counts_the_bound_threads_not_the_pinned_cpus() -> None:
    """The front end's cores are pinned but not bound (docs/tuning.md rule 1)."""
    plan = as_plan(milan_docker(), cpus="0-7", omp_cpus="1-7")
    done = handoff(plan)
    assert (done.threads, done.cpus) == (7, "0-7")
    stored = plan.model_dump(mode="json", exclude={"decisions"})
    flat = plan.decisions.first.model_dump(mode="json")
    legacy = {**flat, **stored}  # format 1: the only server's decisions flat in the plan
    del legacy["kind"]
    del legacy["omp_cpus"]  # a record approved before the bind list was its own field
    assert handoff(Plan.model_validate(migrated_plan(legacy))).threads == 8
