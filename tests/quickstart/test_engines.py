"""quickstart writes each engine's own endpoint file (`QuickstartFile`, the engine's
`QUICKSTART`): llama.cpp's with the real llama.cpp runtime and a real GGUF file, planned,
approved and installed (--no-start); each engine refuses the other's option as bad input, and
llama.cpp without its runtime is refused with the command that builds it. Nothing is written
on a refusal."""

from __future__ import annotations

import tomllib

import pytest

from epycd.approval.record import load_approval
from epycd.cli.quickstart import QuickstartFile
from epycd.engines import ENGINES, Engine
from tests.llama.realllama import SERVER, llama_server, tiny_gguf
from tests.sandbox import CliSandbox


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_every_engine_has_a_quickstart_file(engine: Engine) -> None:
    assert isinstance(engine.implementation("cli", "QUICKSTART", QuickstartFile), QuickstartFile)


@pytest.mark.llama
def test_llama_cpp_writes_plans_and_approves_its_gguf_endpoint(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    llama_server()  # built by the bootstrap, or the test fails saying so
    gguf = tiny_gguf()
    done = sandbox.epycctl(
        "quickstart", "--engine", "llama.cpp", "--model", str(gguf), "--yes", "--no-start",
        EPYCD_LLAMA_RUNTIME_DIR=str(SERVER),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    target = sandbox.settings.config_dir / "default.toml"
    assert tomllib.loads(target.read_text()) == {"engine": "llama.cpp", "model": str(gguf)}
    assert f"runtime: host (llama.cpp, {SERVER / 'bin' / 'llama-server'})" in done.stdout
    approval = load_approval(sandbox.settings, "default")
    assert approval is not None and approval.plan.decisions.engine == "llama.cpp"


@pytest.mark.parametrize(
    ("engine", "option", "value"),
    [
        ("vllm", "--gguf-file", "model-Q4_K_M.gguf"),
        ("vllm", "--quantize", "q4_k_m"),
        ("llama.cpp", "--vllm", "/usr/bin/true"),
    ],
)
def test_an_option_of_the_other_engine_is_bad_input(
    sandbox: CliSandbox, engine: str, option: str, value: str
) -> None:
    sandbox.use_fake_host()
    done = sandbox.epycctl(
        "quickstart", "--engine", engine, "--model", "/models/m.gguf", option, value, "--yes"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert option in done.stderr and "for" in done.stderr
    assert sandbox.written() == []


def test_llama_cpp_without_its_runtime_is_refused_with_the_build_command(
    sandbox: CliSandbox,
) -> None:
    sandbox.use_fake_host()
    empty = sandbox.settings.state_dir.parent / "no-llama-runtime"
    done = sandbox.epycctl(
        "quickstart", "--engine", "llama.cpp", "--model", "/models/m.gguf", "--yes",
        EPYCD_LLAMA_RUNTIME_DIR=str(empty),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"the llama.cpp runtime is not built in {empty}" in done.stderr
    assert "install.sh --engine llama.cpp" in done.stderr
    assert sandbox.written() == []


@pytest.mark.llama
def test_auto_converts_the_safetensors_model_then_approves_it_on_llama_cpp(
    sandbox: CliSandbox,
) -> None:
    """`--engine auto` on a host with llama-server: the default profile (balanced) prefers
    llama.cpp, so the tiny SentencePiece Llama is converted by the real converter (under the
    vLLM venv's torch) before the plan is shown, then approved on the converted file."""
    from tests.health.realvllm import VENV
    from tests.llama.test_convert import tiny_llama

    sandbox.use_fake_host()
    llama_server()
    model = tiny_llama()
    converted = sandbox.tmp / "converted"
    done = sandbox.epycctl(
        "quickstart", "--engine", "auto", "--model", str(model), "--yes", "--no-start",
        EPYCD_LLAMA_RUNTIME_DIR=str(SERVER), EPYCD_RUNTIME_DIR=str(VENV),
        EPYCD_LLAMA_CONVERTED_DIR=str(converted),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    target = sandbox.settings.config_dir / "default.toml"
    assert tomllib.loads(target.read_text()) == {"engine": "auto", "model": str(model)}
    assert "convert: " in done.stdout and "Q8_0.gguf" in done.stdout
    assert 'llama.cpp (engine = "auto"): llama.cpp: profile balanced' in done.stdout
    approval = load_approval(sandbox.settings, "default")
    assert approval is not None and approval.plan.decisions.engine == "llama.cpp"
    assert sorted(p.suffix for p in converted.iterdir()) == [".gguf", ".json"]


def test_auto_refuses_a_vllm_of_its_own_as_bad_input(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    done = sandbox.epycctl(
        "quickstart", "--engine", "auto", "--vllm", "/usr/bin/true", "--yes"
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--vllm" in done.stderr and "--engine vllm" in done.stderr
    assert sandbox.written() == []


def test_auto_with_quantize_writes_it_and_plans_llama_cpp(sandbox: CliSandbox) -> None:
    """`--quantize q4_k_m` (Ollama's weights) goes into the file, and the plan waits for
    that conversion on llama.cpp; answered no, nothing is written or converted."""
    from tests.health.realvllm import VENV
    from tests.llama.test_convert import tiny_llama

    sandbox.use_fake_host()
    llama_server()
    converted = sandbox.tmp / "converted"
    done = sandbox.epycctl(
        "quickstart", "--model", str(tiny_llama()), "--quantize", "q4_k_m",
        EPYCD_LLAMA_RUNTIME_DIR=str(SERVER), EPYCD_RUNTIME_DIR=str(VENV),
        EPYCD_LLAMA_CONVERTED_DIR=str(converted),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "to a q4_k_m GGUF file" in done.stdout, done.stdout
    assert "no terminal to ask on" in done.stderr
    assert sandbox.written() == [] and not converted.exists()
