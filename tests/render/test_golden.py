"""Golden unit files per path: byte for byte; `UPDATE_GOLDEN=1` writes them anew."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epycd.render import render_units, unit_dirs
from tests.render.fixtures import CASES

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    units = render_units(CASES[case]())
    assert len(units) == 1
    [(name, text)] = units.items()
    golden = GOLDEN / f"{case}{Path(name).suffix}"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden} is missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text(encoding="utf-8")


def test_rendering_is_pure() -> None:
    for factory in CASES.values():
        assert render_units(factory()) == render_units(factory())


@pytest.mark.parametrize("case", sorted(CASES))
def test_unit_names_and_folders(case: str) -> None:
    decisions = CASES[case]()
    folders = unit_dirs(decisions, unit_dir=Path("/u"), quadlet_dir=Path("/q"))
    suffix = ".container" if decisions.runtime == "podman" else ".service"
    assert folders == {
        f"epyc-llm-{decisions.endpoint}{suffix}": Path("/q" if suffix == ".container" else "/u")
    }
    assert set(folders) == set(render_units(decisions))


def test_token_never_in_a_unit() -> None:
    for factory in CASES.values():
        decisions = factory()
        text = next(iter(render_units(decisions).values()))
        assert "HF_TOKEN=" not in text
        assert "HUGGING_FACE_HUB_TOKEN" not in text
        if decisions.hf_token_file:
            assert "HF_TOKEN_PATH=" in text
            assert "EnvironmentFile" not in text
