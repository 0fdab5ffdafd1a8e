"""Golden units made by the real planner and renderer from real inputs, one folder per case
(tests/golden/CASE/):

    case.toml       the fake host (tests/hosts.py CATALOGUE), the runtimes it has, what its
                    host vLLM answers when probed, and secret files to create (mode 0600)
    NAME.toml       the endpoint files, as an admin writes them
    expected/       the units the plan installs, byte for byte

The models come from a real Hugging Face cache layout (tests/model/models.py), offline.
`@TMP@` stands for the test's temporary folder, in the inputs and in the expected units.
`UPDATE_GOLDEN=1` writes expected/ anew: review the diff before committing it.

Every Python module a unit runs (ExecCondition=, ExecStartPre=, ExecStart=, ExecStartPost=,
ExecStopPost=) must start: a unit whose command is `python -m` of a module that does not
exist would never start (or never record how a run ended), and systemd-analyze cannot
notice that.
"""

from __future__ import annotations

import os
import shlex
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from epycd.host.facts import HostVllmFacts, RuntimeFacts
from epycd.plan.pipeline.result import EndpointResult
from tests.model.hf_cache import add_to_cache
from tests.model.models import model_files
from tests.plan.conftest import PlanWorkspace, fake_host
from tests.sandbox import run_python
from tests.secrets import root_folder

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
CASES = sorted(folder.name for folder in GOLDEN.iterdir() if (folder / "case.toml").exists())
PLACEHOLDER = "@TMP@"
PRODUCT_PYTHON = "/opt/epyc-llm/venv/bin/python"
"""Where packaging/install.sh puts the product's interpreter."""
COMMAND_KEYS = ("ExecCondition", "ExecStartPre", "ExecStart", "ExecStartPost", "ExecStopPost")


class VllmAnswers(BaseModel):
    """case.toml's [vllm]: what probing any host vLLM executable answers."""

    model_config = ConfigDict(extra="forbid")

    present: bool
    version: str | None = None
    platform: str | None = None


class GoldenCase(BaseModel):
    """case.toml."""

    model_config = ConfigDict(extra="forbid")

    host: str
    runtimes: RuntimeFacts = RuntimeFacts()
    vllm: VllmAnswers | None = None
    secrets: dict[str, str] = {}


def plan_case(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The units of every plan of the case, `tmp_path` written as the placeholder."""
    units: dict[str, str] = {}
    for result in plan_results(case, tmp_path, monkeypatch).values():
        assert result.plan is not None
        units |= result.plan.units
    return {name: text.replace(str(tmp_path), PLACEHOLDER) for name, text in units.items()}


def plan_results(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, EndpointResult]:
    """The planner's result for each endpoint file of the case, by endpoint name, each with
    a plan; `tmp_path` holds the inputs (the placeholder written as `tmp_path`)."""
    folder = GOLDEN / case
    spec = GoldenCase.model_validate(tomllib.loads((folder / "case.toml").read_text()))
    ws = PlanWorkspace(tmp_path)
    for repo_id, files in model_files().items():
        add_to_cache(ws.hf_home / "hub", repo_id, files)
    monkeypatch.setenv("HF_HOME", str(ws.hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for relative, text in spec.secrets.items():
        secret = tmp_path / relative
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(text + "\n")
        secret.chmod(0o600)
    for endpoint in sorted(folder.glob("*.toml")):
        if endpoint.name != "case.toml":
            text = endpoint.read_text().replace(PLACEHOLDER, str(tmp_path))
            (ws.config_dir / endpoint.name).write_text(text)

    def probe(executable: str) -> HostVllmFacts:
        assert spec.vllm is not None, f"{case}: a host vLLM was probed; add [vllm] to case.toml"
        return HostVllmFacts(path=executable, **spec.vllm.model_dump())

    host = fake_host(tmp_path, spec.host, spec.runtimes)
    results = ws.plan(host, probe=probe, product_python=PRODUCT_PYTHON)
    for name, result in results.items():
        assert result.plan is not None, (name, [p.text for p in result.errors])
    return results


@contextmanager
def case_folder(case: str, tmp_path: Path) -> Iterator[Path]:
    """`tmp_path`, or for a case with key or token files a folder only root controls (the
    product refuses a secret anywhere else, tests/secrets.py)."""
    spec = GoldenCase.model_validate(tomllib.loads((GOLDEN / case / "case.toml").read_text()))
    if not spec.secrets:
        yield tmp_path
        return
    with root_folder() as folder:
        yield folder


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with case_folder(case, tmp_path) as folder:
        units = plan_case(case, folder, monkeypatch)
    expected = GOLDEN / case / "expected"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        expected.mkdir(exist_ok=True)
        for stale in expected.iterdir():
            stale.unlink()
        for name, text in units.items():
            (expected / name).write_text(text, encoding="utf-8")
    assert expected.is_dir(), f"{expected} is missing: run with UPDATE_GOLDEN=1 and review it"
    on_disk = {path.name: path.read_text(encoding="utf-8") for path in expected.iterdir()}
    assert sorted(units) == sorted(on_disk)
    for name, text in units.items():
        assert text == on_disk[name], name


def python_modules(unit: str) -> list[str]:
    """The modules a unit runs with the product's interpreter (`PRODUCT_PYTHON -m MODULE`)."""
    modules = []
    for line in unit.splitlines():
        key, _, value = line.partition("=")
        if key not in COMMAND_KEYS:
            continue
        argv = shlex.split(value.lstrip("-@:+!"))
        if argv[:2] == [PRODUCT_PYTHON, "-m"]:
            modules.append(argv[2])
    return modules


def test_every_case_runs_the_approval_check_first() -> None:
    """Each golden unit runs at least the approval check, so the module test below sees it."""
    for case in CASES:
        for unit in (GOLDEN / case / "expected").iterdir():
            assert "epycd.approval.check" in python_modules(unit.read_text()), unit


@pytest.mark.parametrize("case", CASES)
def test_every_module_a_unit_runs_starts(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m MODULE --help` with the interpreter of the product's venv (the one running
    the tests): exit 0 and its usage."""
    with case_folder(case, tmp_path) as folder:
        units = plan_case(case, folder, monkeypatch)
    modules = {module for text in units.values() for module in python_modules(text)}
    assert modules, f"{case}: no unit runs a module of the product"
    for module in sorted(modules):
        done = run_python(["-m", module, "--help"], env=os.environ)
        assert done.returncode == 0, (module, done.stderr)
        assert done.stdout.startswith("Usage: "), (module, done.stdout)
