"""The host vLLM probe is cached across commands (docs/tuning.md rule 6): a second `epycctl plan`
does not import vLLM again; a changed environment is probed again.

The venv is a fake whose `python` counts the probes it answers, so the count is what the real
CLI (a subprocess, real files) did; the real probe of the real venv is tested in
tests/health/test_vllm_probe.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.host.probe_cache import PROBE_CACHE, ProbeCache
from tests.hosts import make_host
from tests.plan.conftest import write_model
from tests.sandbox import REPO, run_python

FAKE_PYTHON = """#!/bin/sh
echo "$2" | grep -q ModelRegistry && what=registry || what=probe
echo "$what" >> "{count}"
if [ "$what" = registry ]; then
  echo '{{"version": "{version}", "supported": ["Qwen3ForCausalLM"], "sections": \
{{"_TEXT_GENERATION_MODELS": {{"Qwen3ForCausalLM": "Qwen3ForCausalLM"}}}}}}'
else
  echo 'EPYCD-VLLM-PROBE {{"version": "{version}", "platform": "ZenCpuPlatform"}}'
fi
"""


def fake_venv(folder: Path, version: str = "0.32.0") -> Path:
    """bin/vllm and a bin/python that answers the probe and the model registry dump as
    vLLM's interpreter does, each time appending what it was asked to `probes`."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python"
    python.write_text(FAKE_PYTHON.format(count=folder / "probes", version=version))
    vllm = bin_dir / "vllm"
    vllm.write_text("#!/bin/sh\nexit 1\n")
    for script in (python, vllm):
        script.chmod(0o755)
    return vllm


def probes(venv: Path) -> list[str]:
    """What the venv's interpreter was asked, in order: each is an import of vLLM."""
    count = venv / "probes"
    return count.read_text().split() if count.exists() else []


def epycctl_plan(tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "EPYCD_CONFIG_DIR": str(tmp_path / "etc"),
        "EPYCD_STATE_DIR": str(tmp_path / "state"),
        "EPYCD_RUN_DIR": str(tmp_path / "run"),
        "EPYCD_UNIT_DIR": str(tmp_path / "systemd"),
        "EPYCD_QUADLET_DIR": str(tmp_path / "quadlet"),
        "EPYCD_HOST_ROOT": str(make_host(tmp_path / "hosts", "genoa-9654-2s-nps1")),
        "HF_HOME": str(tmp_path / "hf"),
    }
    return run_python(["-m", "epycd", "plan", name, "--json", "--sample-seconds", "0"], env=environ)


def test_plan_probes_once_then_again_after_the_venv_changes(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    vllm = fake_venv(venv)
    model = write_model(tmp_path / "models" / "qwen3")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "chat.toml").write_text(
        f'model = "{model}"\nruntime = "host"\nvllm = "{vllm}"\n'
    )
    first = epycctl_plan(tmp_path, "chat")
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads(first.stdout)["vllm_version"] == "0.32.0"
    assert sorted(probes(venv)) == ["probe", "registry"]
    assert (tmp_path / "run" / PROBE_CACHE).is_file()

    second = epycctl_plan(tmp_path, "chat")
    assert second.returncode == 0, second.stdout + second.stderr
    assert len(probes(venv)) == 2, "the second plan imported vLLM again"
    assert json.loads(second.stdout)["units"] == json.loads(first.stdout)["units"]

    later = time.time() + 5
    os.utime(vllm, (later, later))
    third = epycctl_plan(tmp_path, "chat")
    assert third.returncode == 0, third.stdout + third.stderr
    assert sorted(probes(venv)[2:]) == ["probe", "registry"], "a changed venv was not probed"


def test_a_changed_interpreter_is_a_new_key(tmp_path: Path) -> None:
    vllm = fake_venv(tmp_path / "venv")
    before = ProbeCache.key(str(vllm))
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(python.read_text() + "\n")
    after = ProbeCache.key(str(vllm))
    assert before is not None and after is not None and before != after


def test_a_failed_probe_is_not_kept(tmp_path: Path) -> None:
    vllm = fake_venv(tmp_path / "venv")
    (tmp_path / "venv" / "bin" / "python").write_text("#!/bin/sh\nexit 3\n")
    cache = ProbeCache(tmp_path / "run" / PROBE_CACHE)
    assert not cache.probe(str(vllm)).present
    assert cache.load() == {}


PROBE_AS_NOBODY = (
    "import sys; from pathlib import Path; from epycd.host.probe_cache import ProbeCache;"
    "c = ProbeCache(Path(sys.argv[1])); f = c.probe(sys.argv[2]);"
    "print(f.present, f.platform, c.key(sys.argv[2]))"
)


def probe_as_nobody(cache: Path, vllm: Path) -> subprocess.CompletedProcess[str]:
    """The cached probe as uid 65534: prints present, platform and the full key."""
    argv = ["-c", PROBE_AS_NOBODY, str(cache), str(vllm)]
    return run_python(argv, env={"PYTHONPATH": str(REPO)}, user=65534)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder another user can reach (pytest's own is root-only)."""
    base = Path(tempfile.mkdtemp(prefix="epycd-probe-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_user_who_cannot_reach_the_interpreter_reads_roots_entry(open_tmp: Path) -> None:
    """A venv whose interpreter lies under a root-only folder (the test venv's is under
    /root): a user cannot identify the interpreter, so the unchanged executable alone finds
    the entry root stored; without one the probe says why instead of raising; nothing is
    stored under a half key."""
    venv = open_tmp / "venv"
    vllm = fake_venv(venv)
    cache = ProbeCache(open_tmp / "run" / PROBE_CACHE)
    stored = cache.probe(str(vllm))
    assert stored.present and probes(venv) == ["probe"]

    hidden = open_tmp / "rootonly"
    hidden.mkdir(mode=0o700)
    real_python = venv / "bin" / "python"
    (hidden / "python").write_bytes(real_python.read_bytes())
    (hidden / "python").chmod(0o755)
    real_python.unlink()
    real_python.symlink_to(hidden / "python")
    os.utime(hidden / "python", (1, 1))  # a new interpreter identity for root
    as_user = probe_as_nobody(cache.path, vllm)
    assert as_user.returncode == 0, as_user.stderr
    assert as_user.stdout.split() == ["True", "ZenCpuPlatform", "None"]
    assert probes(venv) == ["probe"], "the user's status imported vLLM again"

    cache.path.unlink()
    as_user = probe_as_nobody(cache.path, vllm)
    assert as_user.returncode == 0, as_user.stderr
    assert as_user.stdout.split()[:2] == ["False", "None"]
    assert not cache.path.exists()
