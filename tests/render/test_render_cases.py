"""The renderer on the hand-made decisions of tests/render/fixtures.py: unit names and
folders, no token in a unit, output that depends on the decisions alone. (The golden units
from the real planner are tests/render/test_golden.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epycd.plan.endpoint import decisions_of
from epycd.render import unit_dirs
from tests.render.fixtures import CASES, units_of
from tests.sandbox import REPO, run_python

RENDER_ALL = (
    "import json; from tests.render.fixtures import CASES, units_of;"
    "print(json.dumps({case: units_of(make()) for case, make in CASES.items()}))"
)


def test_rendering_depends_only_on_the_decisions(tmp_path: Path) -> None:
    """The units of a case are the same in another process with another hash seed, another
    working folder and none of this environment (no set order, clock, locale or variable
    leaks in), and rendering leaves the decisions as they were."""
    here = {}
    for case, make in CASES.items():
        decisions = make()
        before = decisions.model_dump_json()
        here[case] = units_of(decisions)
        assert decisions.model_dump_json() == before, case
    elsewhere = {"PYTHONPATH": str(REPO), "PYTHONHASHSEED": "4242", "TZ": "Pacific/Kiritimati",
                 "LANG": "tr_TR.UTF-8", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = run_python(["-c", RENDER_ALL], env=elsewhere)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == here


@pytest.mark.parametrize("case", sorted(CASES))
def test_unit_names_and_folders(case: str) -> None:
    decisions = CASES[case]()
    folders = unit_dirs(decisions_of(decisions), unit_dir=Path("/u"), quadlet_dir=Path("/q"))
    suffix = ".container" if decisions.runtime == "podman" else ".service"
    assert folders == {
        f"epyc-llm-{decisions.endpoint}{suffix}": Path("/q" if suffix == ".container" else "/u")
    }
    assert set(folders) == set(units_of(decisions))


def test_token_never_in_a_unit() -> None:
    assert any(factory().hf_token_file for factory in CASES.values()), "no case has a token"
    for factory in CASES.values():
        decisions = factory()
        text = next(iter(units_of(decisions).values()))
        assert "HF_TOKEN=" not in text
        assert "HUGGING_FACE_HUB_TOKEN" not in text
        if decisions.hf_token_file:
            assert "HF_TOKEN_PATH=" in text
            assert "EnvironmentFile" not in text
