"""quickstart on the embedded runtime (the tests' real CPU venv, built by
packaging/vllm-runtime.sh: vLLM 0.32.0 with zentorch 2.13) is one of the validated pairs: no
warning that it is not the image's vLLM. A host vLLM off the pairs is warned about
(tests/plan/test_validated_stacks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.health.realvllm import VENV, tiny_model
from tests.machine import Serving, vllm_runs_zen_here
from tests.sandbox import CliSandbox

pytestmark = pytest.mark.vllm


def test_quickstart_on_the_embedded_runtime_warns_of_no_unvalidated_vllm(
    sandbox: CliSandbox,
) -> None:
    sandbox.use_fake_host()
    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(VENV)
    consent = Serving(Path("/"), "Genoa", bf16=True, zen_platform=vllm_runs_zen_here())
    done = sandbox.epycctl(
        "quickstart",
        "--model",
        str(tiny_model()),
        "--yes",
        "--no-start",
        *consent.consent_args,
        system_path=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert 'runtime: chosen by the plan (engine = "auto") from: vllm host' in done.stdout
    assert "not the pinned" not in output
    assert "not a validated stack" not in output
