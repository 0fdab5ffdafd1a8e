"""Every rendered unit passes the real tools: systemd-analyze verify and Quadlet 5.4."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.render.fixtures import CASES, runnable, units_of
from tests.render.realtools import quadlet_dryrun, verify, write_units


def _rendered(product_python: str, vllm: Path, suffix: str) -> dict[str, str]:
    units: dict[str, str] = {}
    for factory in CASES.values():
        for name, text in units_of(runnable(factory(), product_python, vllm)).items():
            if name.endswith(suffix):
                units[name] = text
    return units


def test_services_pass_systemd_analyze_verify(
    tmp_path: Path, product_python: str, real_vllm: Path
) -> None:
    units = _rendered(product_python, real_vllm, ".service")
    assert len(units) == 5
    verify(write_units(tmp_path, units))


def test_verify_is_a_real_check(tmp_path: Path, product_python: str, real_vllm: Path) -> None:
    """The same units with a missing interpreter or a bad key do fail verify."""
    units = _rendered(product_python, real_vllm, ".service")
    name, text = next(iter(units.items()))
    broken = {name: text.replace(product_python, "/nonexistent/python", 1)}
    with pytest.raises(AssertionError):
        verify(write_units(tmp_path / "a", broken))
    typo = {name: text.replace("NUMAPolicy=", "NUMAPolcy=").replace("Type=notify", "Type=notfy")}
    with pytest.raises(AssertionError):
        verify(write_units(tmp_path / "b", typo))


@pytest.mark.quadlet
def test_containers_pass_quadlet_and_the_generated_services_verify(
    tmp_path: Path, product_python: str, real_vllm: Path
) -> None:
    if not os.access("/usr/bin/podman", os.X_OK):
        pytest.fail(
            "/usr/bin/podman is missing (generated services run it): run tests/bootstrap.sh"
        )
    containers = _rendered(product_python, real_vllm, ".container")
    assert len(containers) == 4
    write_units(tmp_path / "quadlet", containers)
    generated = quadlet_dryrun(tmp_path / "quadlet")
    assert set(generated) == {name.replace(".container", ".service") for name in containers}
    for name, text in generated.items():
        assert "ExecStart=/usr/bin/podman run" in text, name
    verify(write_units(tmp_path / "generated", generated))


@pytest.mark.quadlet
def test_quadlet_mangles_what_the_renderer_refuses(tmp_path: Path) -> None:
    """Why `;` and empty words are refused on the podman path: the real generator's output."""
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "semi.container").write_text(
        '[Container]\nImage=docker.io/library/x:1\nExec=a ";" b\n'
    )
    (folder / "empty.container").write_text(
        '[Container]\nImage=docker.io/library/x:1\nExec=a "" b\n'
    )
    generated = quadlet_dryrun(folder)
    semi = next(
        line for line in generated["semi.service"].splitlines() if line.startswith("ExecStart=")
    )
    assert semi.endswith(" docker.io/library/x:1 a ; b")  # a lone ';' ends the command for systemd
    empty = next(
        line for line in generated["empty.service"].splitlines() if line.startswith("ExecStart=")
    )
    assert empty.endswith(" docker.io/library/x:1 a")  # everything after the empty word is gone
