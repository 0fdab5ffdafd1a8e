"""No endpoint file can add a line or a directive to a unit: random values with spaces,
quotes, `%`, `$`, `\\`, newlines and other control characters are either refused (naming
the file and the key) or reach the units without adding a directive."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from epycd.host.facts import HostFacts
from epycd.plan.pipeline.result import EndpointResult
from epycd.spec.policy import env_refusal
from tests.plan.conftest import PlanWorkspace, cpu, fake_host

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"])
    | st.sampled_from(list(" \"'%$\\\n\r\t;=#[]{}")),
    min_size=1,
    max_size=24,
)
ENV_KEY = st.from_regex(r"VLLM_[A-Za-z0-9_]{1,10}", fullmatch=True).filter(
    lambda k: env_refusal(k, "") is None
)
"""Names an endpoint file may set (the others are refused: tests/plan/test_spec.py)."""


@functools.cache
def workspace() -> tuple[PlanWorkspace, HostFacts]:
    tmp = Path(tempfile.mkdtemp(prefix="plan-unsafe-"))
    return PlanWorkspace(tmp), fake_host(tmp, "genoa-9654-2s-nps1")


def directives(units: dict[str, str]) -> dict[str, list[str]]:
    return {
        name: [line.split("=", 1)[0] for line in text.splitlines() if "=" in line]
        for name, text in units.items()
    }


@functools.cache
def baseline() -> dict[str, list[str]]:
    ws, host = workspace()
    ws.endpoint("fuzz", 'served_model_name = "x"\nextra_args = ["--seed"]\n[env]\nVLLM_A_B = "1"\n')
    result = ws.plan(host)["fuzz"]
    assert result.plan is not None
    return directives(result.plan.units)


def plan_with(table: dict[str, object]) -> tuple[Path, EndpointResult]:
    ws, host = workspace()
    path = ws.config_dir / "fuzz.toml"
    path.write_text(tomli_w.dumps({"model": str(ws.model), **table}))
    return path, ws.plan(host)["fuzz"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(served=TEXT, arg=TEXT, env_key=ENV_KEY, env_value=TEXT)
@example(served="-A", arg="1", env_key="VLLM_A_B", env_value="1")  # a name vLLM reads as a flag
def test_values_are_refused_or_add_no_directive(
    served: str, arg: str, env_key: str, env_value: str
) -> None:
    table: dict[str, object] = {
        "served_model_name": served,
        "extra_args": ["--seed", arg],
        "env": {env_key: env_value},
    }
    path, result = plan_with(table)
    if result.plan is None:
        assert result.errors
        for problem in result.errors:
            assert problem.file == str(path)
            assert problem.key and problem.key.split("[")[0].split(".")[0] in table
        return
    plan = result.plan
    decisions = cpu(plan)
    assert served in decisions.vllm_args and arg in decisions.vllm_args
    assert decisions.env[env_key] == env_value
    for value in (served, arg, env_value):
        assert not any(ch in value for ch in "\n\r\x00")
    assert directives(plan.units) == baseline()
