"""`epycctl check-model` judges a model by the vLLM that serves on this host and says which:
here no podman, docker or vllm is on PATH, so `runtime = "auto"` serves with the embedded
runtime (EPYCD_RUNTIME_DIR). Its vLLM is a fake venv whose interpreter answers the probe as
the real one does; the architecture is one vLLM 0.32.0 added (not in 0.25.1's table)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.plan.conftest import QWEN3_0_6B_CONFIG, write_model
from tests.sandbox import CliSandbox

PROBE = (
    "#!/bin/sh\necho 'EPYCD-VLLM-PROBE "
    '{"version": "0.32.0+cpu", "platform": "ZenCpuPlatform", "zentorch": "2.13.0.1"}'
    "'\n"
)


def embedded_runtime(folder: Path) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(PROBE)
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 1\n")
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return bin_dir / "vllm"


def check(tmp_path: Path, runtime_dir: Path, *args: str) -> tuple[int, dict[str, object]]:
    sandbox = CliSandbox.create(tmp_path / "sandbox", HF_HUB_OFFLINE="1")
    sandbox.vars["EPYCD_RUNTIME_DIR"] = str(runtime_dir)
    model = write_model(
        tmp_path / "qwen3_5", {**QWEN3_0_6B_CONFIG, "architectures": ["Qwen3_5ForCausalLM"]}
    )
    done = sandbox.epycctl("check-model", str(model), *args, "--json", system_path=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


def test_judged_by_the_embedded_runtimes_vllm(tmp_path: Path) -> None:
    vllm = embedded_runtime(tmp_path / "runtime")
    code, data = check(tmp_path, tmp_path / "runtime")
    assert code == 0 and data["kind"] == "text", data
    assert (data["vllm_version"], data["table_version"]) == ("0.32.0+cpu", "0.32.0")
    assert data["judged_by"] == f"the vLLM that serves here: the host vLLM {vllm}"


def test_without_the_runtime_judged_by_its_validated_version(tmp_path: Path) -> None:
    code, data = check(tmp_path, tmp_path / "no-runtime")
    assert code == 0 and data["vllm_version"] == "0.32.0", data
    assert "the embedded runtime's" in str(data["judged_by"])


def test_a_version_asked_for_is_the_one_judged_by(tmp_path: Path) -> None:
    embedded_runtime(tmp_path / "runtime")
    code, data = check(tmp_path, tmp_path / "runtime", "--vllm-version", "0.25.1")
    assert code == 1 and data["kind"] == "unsupported", data
    assert data["judged_by"] == "as asked (--vllm-version)"
