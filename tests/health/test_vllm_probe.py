"""probe_vllm against the real CPU venv and against broken or absent ones."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from epycd.host.vllm_probe import interpreter_of, probe_vllm
from tests.health.realvllm import (
    real_vllm_executable,
    stock_vllm_executable,
    vllm_executable,
)
from tests.machine import vllm_runs_zen_here


def expected_platform() -> str:
    """vLLM's own rule, applied to this machine's /proc/cpuinfo (tests/machine.py)."""
    return "ZenCpuPlatform" if vllm_runs_zen_here() else "CpuPlatform"


@pytest.mark.vllm
def test_real_venv_reports_version_and_this_machines_platform() -> None:
    vllm = vllm_executable()
    facts = probe_vllm(str(vllm))
    assert facts.present, facts.error
    assert facts.version is not None and facts.version.startswith("0.32.0")
    assert facts.platform == expected_platform()
    assert facts.path == str(vllm)


@pytest.mark.vllm
def test_zentorch_hidden_is_the_stock_platform_on_any_machine() -> None:
    """A venv whose zentorch cannot import: vLLM's plain CpuPlatform, on AMD and Intel."""
    facts = probe_vllm(str(stock_vllm_executable()))
    assert facts.present, facts.error
    assert facts.platform == "CpuPlatform"


@pytest.mark.vllm
def test_shebang_interpreter_is_used_when_no_python_is_beside(tmp_path: Path) -> None:
    """A vllm script copied elsewhere (e.g. a symlink farm) still names its interpreter."""
    vllm = real_vllm_executable()
    copied = tmp_path / "bin" / "vllm"
    copied.parent.mkdir()
    copied.write_bytes(vllm.read_bytes())
    copied.chmod(0o755)
    assert interpreter_of(copied) == Path(vllm.read_text().splitlines()[0][2:])
    facts = probe_vllm(str(copied))
    assert facts.present, facts.error
    assert facts.platform == (
        "ZenCpuPlatform" if vllm_runs_zen_here(stock=False) else "CpuPlatform"
    )


def test_absent_executable_is_reported_not_raised(tmp_path: Path) -> None:
    facts = probe_vllm(str(tmp_path / "nope" / "vllm"))
    assert not facts.present
    assert facts.error is not None and "no such executable" in facts.error


def test_name_not_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    facts = probe_vllm("vllm")
    assert not facts.present and facts.error is not None


def write_script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_venv_without_vllm_module_is_broken_with_the_import_error(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "python", f'#!/bin/sh\nexec {sys.executable} -I "$@"\n')
    vllm = write_script(tmp_path / "bin" / "vllm", "#!/bin/sh\n")
    facts = probe_vllm(str(vllm))
    assert not facts.present
    assert facts.error is not None and "No module named 'vllm'" in facts.error


def test_script_without_shebang_or_python_beside(tmp_path: Path) -> None:
    vllm = write_script(tmp_path / "vllm", "echo hi\n")
    facts = probe_vllm(str(vllm))
    assert not facts.present
    assert facts.error is not None and "no python beside it" in facts.error


def test_hanging_interpreter_times_out(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "python", "#!/bin/sh\nexec sleep 30\n")
    vllm = write_script(tmp_path / "bin" / "vllm", "#!/bin/sh\n")
    facts = probe_vllm(str(vllm), timeout=0.5)
    assert not facts.present
    assert facts.error is not None and "took over 0.5 s" in facts.error


def test_interpreter_printing_garbage(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "python", "#!/bin/sh\necho 'EPYCD-VLLM-PROBE {not json'\n")
    vllm = write_script(tmp_path / "bin" / "vllm", "#!/bin/sh\n")
    facts = probe_vllm(str(vllm))
    assert not facts.present and facts.error is not None
    assert os.path.basename(facts.path) == "vllm"
