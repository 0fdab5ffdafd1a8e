"""An endpoint's decisions made a result: its units rendered (with the `UnitRenderer` it is
given) and fingerprinted (`finish`, `plan_result`), or the refusal of one that does not fit
with its inputs' fingerprint (`unfit`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epycd.errors import EpycError
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import EndpointDecisions, Plan, UnitRenderer
from epycd.plan.engines import planner_for
from epycd.plan.pipeline.fingerprint import fingerprint, fingerprint_inputs, inputs_fingerprint
from epycd.plan.pipeline.result import EndpointResult, failed
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import Prepared
from epycd.plan.problem import Problem
from epycd.settings import Settings
from epycd.stack import Stack


def finish(
    prepared: Prepared,
    decisions: EndpointDecisions,
    *,
    host: HostFacts,
    stack: Stack,
    settings: Settings,
    render: UnitRenderer,
) -> Plan:
    """The decisions with their units rendered and fingerprinted."""
    units, dirs = render(decisions, settings.unit_dir, settings.quadlet_dir)
    inputs = _inputs(prepared, stack, host, decisions, units, dirs)
    return Plan(
        decisions=decisions,
        units=units,
        unit_dirs=dirs,
        fingerprint=fingerprint(inputs),
        inputs_fingerprint=inputs_fingerprint(inputs),
    )


def _inputs(
    prepared: Prepared,
    stack: Stack,
    host: HostFacts,
    decisions: EndpointDecisions,
    units: Mapping[str, str],
    dirs: Mapping[str, str],
) -> dict[str, Any]:
    """What an endpoint's fingerprints cover; a refused endpoint has no units."""
    return fingerprint_inputs(
        units=units,
        unit_dirs=dirs,
        spec_sha256=prepared.result.content_sha256,
        stack_sha256=stack.content_sha256,
        model=prepared.facts,
        host=host,
        decisions=decisions,
    )


def unfit(
    prepared: Prepared, decisions: EndpointDecisions, host: HostFacts, stack: Stack
) -> EndpointResult:
    """The refusal of an endpoint that does not fit (its engine's `unfit`), with its inputs'
    fingerprint: memory short now is no drift of an approved endpoint whose inputs did not
    change. A set is refused by its member with the least room."""
    refusal = planner_for(prepared.spec.engine).unfit(prepared, decisions.tightest_server)
    decisions.errors.append(Problem.of(refusal))
    inputs = _inputs(prepared, stack, host, decisions, units={}, dirs={})
    return failed(
        prepared.result,
        refusal,
        model_facts=prepared.facts,
        decisions=decisions,
        unfit_inputs_fingerprint=inputs_fingerprint(inputs),
    )


def plan_result(prepared: Prepared, decisions: EndpointDecisions, share: Sharing) -> EndpointResult:
    """The result of a CPU or an Instinct GPU endpoint's decisions: their plan, or the error
    rendering it raised."""
    try:
        plan = finish(
            prepared,
            decisions,
            host=share.host,
            stack=share.stack,
            settings=share.settings,
            render=share.render,
        )
    except EpycError as exc:
        decisions.errors.append(Problem.of(exc))
        return failed(prepared.result, exc, model_facts=prepared.facts, decisions=decisions)
    return EndpointResult(
        endpoint=prepared.result.name,
        config_file=str(prepared.result.path),
        plan=plan,
        model_facts=prepared.facts,
    )
