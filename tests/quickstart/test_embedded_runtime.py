"""The embedded runtime (`packaging/install.sh --runtime`, EPYCD_RUNTIME_DIR here): where no
container runtime and no vllm on PATH is present, quickstart and `runtime = "auto"` serve
with its vLLM. The real CPU venv of the tests is built by the same recipe
(packaging/vllm-runtime.sh), so it stands as the embedded runtime, probed for real, on a fake
host shaped like this machine; PATH holds no podman, docker or vllm. Starting it on real
systemd is tests/e2e/test_runtime.py's."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.health.realvllm import REPO, VENV, tiny_model
from tests.machine import Serving, vllm_runs_zen_here
from tests.sandbox import CliSandbox

pytestmark = pytest.mark.vllm


def consent() -> list[str]:
    return Serving(Path("/"), "Genoa", bf16=True, zen_platform=vllm_runs_zen_here()).consent_args


def test_quickstart_serves_with_the_embedded_runtime(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(VENV)
    model = tiny_model()
    done = sandbox.epycctl(
        "quickstart", "--model", str(model), "--yes", "--no-start", *consent(), system_path=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    assert 'runtime: chosen by the plan (engine = "auto") from: vllm host;' in done.stdout
    written = tomllib.loads((sandbox.settings.config_dir / "default.toml").read_text())
    assert written == {"engine": "auto", "model": str(model)}


def test_quickstart_engine_vllm_names_the_embedded_runtime(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(VENV)
    model = tiny_model()
    done = sandbox.epycctl(
        "quickstart", "--engine", "vllm", "--model", str(model), "--yes", "--no-start",
        *consent(), system_path=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "runtime: host;" in done.stdout
    written = tomllib.loads((sandbox.settings.config_dir / "default.toml").read_text())
    assert written == {"model": str(model), "runtime": "host", "vllm": str(VENV / "bin" / "vllm")}


def test_auto_plans_with_the_embedded_runtime(sandbox: CliSandbox) -> None:
    """An endpoint file without runtime or vllm: `runtime = "auto"` finds no container
    runtime and serves with the embedded vLLM; without it, the refusal names the fix."""
    sandbox.use_fake_host()
    (sandbox.settings.config_dir / "chat.toml").write_text(
        f'model = "{tiny_model()}"\nmax_model_len = 512\n'
    )
    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(sandbox.tmp / "no-runtime")
    absent = sandbox.epycctl("plan", "chat", "--json", system_path=False)
    assert absent.returncode == 1, absent.stdout + absent.stderr
    assert "no container runtime and no host vLLM" in absent.stdout + absent.stderr

    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(VENV)
    done = sandbox.epycctl("plan", "chat", "--json", system_path=False)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout)
    assert plan["runtime"] == "host", plan
    assert plan["vllm_executable"] == str(VENV / "bin" / "vllm"), plan


def test_no_embedded_runtime_is_named_with_its_fix(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    missing = sandbox.tmp / "runtime"
    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(missing)
    done = sandbox.epycctl("quickstart", "--yes", system_path=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no embedded runtime in {missing}" in done.stderr
    assert "packaging/install.sh --runtime" in done.stderr
    assert sandbox.written() == []


def test_the_tests_venv_is_the_recipes() -> None:
    """One recipe: the cached venv carries the stamp packaging/vllm-runtime.sh gives it, so
    tests/tools/vllm_venv.sh keeps it (no rebuild) and the tests serve what admins get."""
    recipe = REPO / "packaging" / "vllm-runtime.sh"
    stamp = subprocess.run(
        [str(recipe), "--stamp", "--zentorch", "yes"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert (VENV / ".epyc-stamp").read_text().strip() == stamp
    tool = (REPO / "tests" / "tools" / "vllm_venv.sh").read_text()
    assert "packaging/vllm-runtime.sh" in tool and "pip install" not in tool
