"""What the commands print for the golden cases: a safety net of today's output, next to each
case's units (tests/golden/CASE/, made by tests/render/test_golden.py's planning of the same
inputs):

    plan.json   `epycctl plan NAME --json` for each endpoint of the case (cli/plan.py's
                `plan_json` of the planner's result), keyed by endpoint name
    bench.json  the `vllm bench throughput` command `epycctl bench NAME --offline` runs with
                its defaults (vLLM's cli/bench.py `throughput_argv`: 4 prompts per sequence, at
                least 8; 128 tokens in and out), keyed by endpoint name

and for the renderer's hand-written decisions (tests/render/fixtures.py CASES) the same
command in tests/golden/bench-fixtures.json.

`@TMP@` stands for the test's folder, as in the units; `@FINGERPRINT@` for the plan's
fingerprint, which hashes the units and so the folder (tests/plan/test_fingerprint.py pins
it, planned in a fixed folder); `@RESULTS@` for the benchmark's result folder (a new
temporary folder each run) and `numactl` for where numactl is installed.

Today's output is pinned as it is, oddities included: an instance set's top-level keys other
than its balancer's are member 0's (vllm_args with member 0's `--port`, env, socket,
max_model_len...) and `instances` is every member's whole decisions; an Instinct endpoint has
no device, gpus or tensor_parallel_size key, and its CPU-only memory keys are 0. A set's
benchmark runs member 0's flags (and environment) pinned to every member's CPUs; an Instinct
endpoint's runs with its recipe's engine flags and --tensor-parallel-size but
without the GPUs' devices in the container, with 8 prompts (its max_num_seqs is 0).
`UPDATE_GOLDEN=1` writes the files anew: review the diff before committing it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from epycd.cli.plan import plan_json
from epycd.engines.vllm.cli.bench import throughput_argv
from epycd.model.facts import POOLING_ENDPOINTS
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from tests.render.fixtures import CASES as FIXTURES
from tests.render.fixtures import as_plan
from tests.render.test_golden import CASES, GOLDEN, PLACEHOLDER, case_folder, plan_results

FINGERPRINT = "@FINGERPRINT@"
RESULTS = Path("@RESULTS@")
PROMPTS_PER_SEQUENCE = 4
"""`bench --prompts-per-concurrency`'s default; offline, the concurrency is max_num_seqs."""
LENGTHS = (128, 128)
"""`bench --input-len` and `--output-len`'s defaults."""


class Planned(NamedTuple):
    results: dict[str, EndpointResult]
    folder: str


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Planned]:
    """The case's planner results (each case planned once for both goldens)."""
    done: dict[str, Planned] = {}

    def plan(case: str) -> Planned:
        if case not in done:
            with (
                pytest.MonkeyPatch.context() as monkeypatch,
                case_folder(case, tmp_path_factory.mktemp(case)) as folder,
            ):
                done[case] = Planned(plan_results(case, folder, monkeypatch), str(folder))
        return done[case]

    return plan


def as_text(data: Any, folder: str | None = None) -> str:
    """As `print_json` prints it (cli/output.py), the folder written as the placeholder."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    return text.replace(folder, PLACEHOLDER) if folder else text


def check_golden(path: Path, text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} is missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8"), path


def plan_output(result: EndpointResult) -> dict[str, Any]:
    data = plan_json(result)
    assert re.fullmatch("[0-9a-f]{64}", data["fingerprint"]), data["fingerprint"]
    return data | {"fingerprint": FINGERPRINT}


def offline_bench(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`bench NAME --offline`'s command with its default options."""
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: name)
    prompts = max(8, PROMPTS_PER_SEQUENCE * plan.decisions.max_num_seqs)
    return throughput_argv(plan, prompts, LENGTHS, RESULTS)


@pytest.mark.parametrize("case", CASES)
def test_plan_json(case: str, planned: Callable[[str], Planned]) -> None:
    results, folder = planned(case)
    outputs = {name: plan_output(result) for name, result in sorted(results.items())}
    check_golden(GOLDEN / case / "plan.json", as_text(outputs, folder))


@pytest.mark.parametrize("case", CASES)
def test_offline_bench_argv(
    case: str, planned: Callable[[str], Planned], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embeddings or rerank endpoint has none (`bench --offline` refuses it:
    tests/approval/test_bench_pooling.py), nor a case of only those a bench.json."""
    results, folder = planned(case)
    argvs = {}
    for name, result in sorted(results.items()):
        assert result.plan is not None
        if result.plan.decisions.primary_endpoint not in POOLING_ENDPOINTS:
            argvs[name] = offline_bench(result.plan, monkeypatch)
    if not argvs:
        assert not (GOLDEN / case / "bench.json").exists()
        return
    check_golden(GOLDEN / case / "bench.json", as_text(argvs, folder))


def test_offline_bench_argv_of_the_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    argvs = {case: offline_bench(as_plan(make()), monkeypatch) for case, make in FIXTURES.items()}
    check_golden(GOLDEN / "bench-fixtures.json", as_text(argvs))
