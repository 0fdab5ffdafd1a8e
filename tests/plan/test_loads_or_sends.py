"""One policy for extra_args and env: a flag or variable that loads code, widens what the server
reads or sends data out is refused with its reason, or allowed only with the approver's consent,
which the plan shows (epycd.spec.policy.LOADS_OR_SENDS_*)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epycd.approval.workflow import gate
from epycd.errors import Refusal
from epycd.spec import SpecResult, parse_endpoint
from epycd.spec.policy import LOADS_OR_SENDS_ARGS, LOADS_OR_SENDS_ENV, consent_reasons
from epycd.stack import shipped_stack
from tests.plan.conftest import PlanWorkspace, fake_host

VALUE = "/srv/x"


def spellings(flag: str) -> list[list[str]]:
    """`--flag`, `--flag=value`, `--flag value`, vLLM's `--flag_name=value`, an abbreviation."""
    underscored = "--" + flag[2:].replace("-", "_")
    return [[flag], [f"{flag}={VALUE}"], [flag, VALUE], [f"{underscored}={VALUE}"], [flag[:-1]]]


ARG_CASES = [
    pytest.param(flag, args, id=" ".join(args))
    for flag in LOADS_OR_SENDS_ARGS
    for args in spellings(flag)
]


def parsed(tmp_path: Path, text: str) -> SpecResult:
    return parse_endpoint(tmp_path / "e.toml", text.encode(), precisions=shipped_stack().precisions)


@pytest.mark.parametrize(("flag", "args"), ARG_CASES)
def test_each_flag_is_refused_or_needs_consent(tmp_path: Path, flag: str, args: list[str]) -> None:
    reach = LOADS_OR_SENDS_ARGS[flag]
    result = parsed(tmp_path, f"extra_args = {json.dumps(args)}\n")
    if reach.consent:
        assert result.ok, result.errors
        [reason] = consent_reasons(args, {})
        assert reason.startswith(f"extra_args {flag}")
        if "{value}" in reach.why and (len(args) > 1 or "=" in args[0]):
            assert VALUE in reason
    else:
        [error] = result.errors
        assert error.key == "extra_args[0]" and flag in error.message
        assert reach.why in error.message


@pytest.mark.parametrize("name", sorted(LOADS_OR_SENDS_ENV))
def test_each_variable_is_refused_or_needs_consent(tmp_path: Path, name: str) -> None:
    reach = LOADS_OR_SENDS_ENV[name]
    result = parsed(tmp_path, f'[env]\n{name} = "1"\n')
    if reach.consent:
        assert result.ok, result.errors
        assert consent_reasons([], {name: "1"}) == [f"env {name}=1: {reach.why}"]
    else:
        [error] = result.errors
        assert error.key == f"env.{name}" and reach.why in error.message


@pytest.mark.parametrize("name", ["VLLM_SOME_URL", "VLLM_TRACE_ENDPOINT", "VLLM_X_SERVER"])
def test_a_variable_naming_an_address_is_refused(tmp_path: Path, name: str) -> None:
    [error] = parsed(tmp_path, f'[env]\n{name} = "http://x"\n').errors
    assert "sends data" in error.message


def test_short_spellings_are_refused(tmp_path: Path) -> None:
    [error] = parsed(tmp_path, 'extra_args = ["-x", "value"]\n').errors
    assert error.key == "extra_args[0]" and "short flag" in error.message


def test_the_consent_is_shown_in_the_plan_and_asked_at_approval(ws: PlanWorkspace) -> None:
    ws.endpoint(
        "c",
        'extra_args = ["--trust-remote-code", "--otlp-traces-endpoint", "http://otel:4317"]\n'
        '[env]\nVLLM_DEBUG_LOG_API_SERVER_RESPONSE = "1"\n',
    )
    plan = ws.plan(fake_host(ws.tmp, "this-machine-genoa-vm"))["c"].plan
    assert plan is not None and plan.decisions.requires_confirmation
    shown = "\n".join(plan.decisions.confirmation_reasons)
    assert "extra_args --trust-remote-code: it runs the model repository's own" in shown
    assert "extra_args --otlp-traces-endpoint http://otel:4317: it sends a trace" in shown
    assert "env VLLM_DEBUG_LOG_API_SERVER_RESPONSE=1" in shown
    with pytest.raises(Refusal, match="needs explicit consent"):
        gate(plan, accept_unvalidated=False)
    gate(plan, accept_unvalidated=True)
