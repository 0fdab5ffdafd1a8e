"""`epycctl convert`: the real converter of the pinned llama.cpp source (unpacked from the
sdist the runtime recipe keeps) under the vLLM venv's torch and transformers, the real `llama
quantize`, and the real llama-server serving what they wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from epycd.engines.llama_cpp.model.convert import (
    CONVERTER_DIR,
    ConverterRefused,
    convert,
    converter_refusal,
    installed_converter,
    kept_step,
    stamp_of,
)
from epycd.engines.llama_cpp.model.format import load_table, parse_converter_map, pinned_version
from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.errors import InputError, Refusal
from tests.health.realvllm import CACHE, VENV
from tests.llama.realllama import SERVER, llama_server, serving
from tests.sandbox import REPO

TINY_LLAMA = CACHE / "tiny-llama"
TINY_EMBEDDER = CACHE / "tiny-pooling" / "embedder"
PYTHON = str(VENV / "bin" / "python")


def tiny_llama() -> Path:
    if not (TINY_LLAMA / "tokenizer.model").is_file():
        pytest.fail(f"no {TINY_LLAMA}: run tests/bootstrap.sh (tests/tools/tiny_llama.sh)")
    return TINY_LLAMA


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    """A llama.cpp runtime folder as the recipe leaves one: the built binaries and the
    converter it installs (links to the test cache's, which the recipe built)."""
    llama_server()
    folder = tmp_path / "llama-runtime"
    folder.mkdir()
    (folder / "bin").symlink_to(SERVER / "bin")
    (folder / CONVERTER_DIR).symlink_to(SERVER / CONVERTER_DIR)
    return folder


def test_the_table_lists_what_the_pinned_converter_takes() -> None:
    converts = load_table(pinned_version()).converts
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "BertModel"} <= set(converts)
    assert converts == sorted(converts)
    assert converter_refusal(["LlamaForCausalLM"]) is None
    refusal = converter_refusal(["NoSuchForCausalLM"])
    assert refusal is not None and "NoSuchForCausalLM" in refusal


def test_the_map_is_read_from_the_source_not_run() -> None:
    source = 'X = 1\nTEXT_MODEL_MAP: dict[str, str] = {"BForLM": "b", "AForLM": "a"}\n'
    assert parse_converter_map(source) == ["AForLM", "BForLM"]
    with pytest.raises(InputError, match="no TEXT_MODEL_MAP"):
        parse_converter_map("OTHER = {}\n")


def test_q8_0_conversion_serves_a_chat(runtime: Path, tmp_path: Path) -> None:
    said: list[str] = []
    out = tmp_path / "tiny.gguf"
    done = convert(
        str(tiny_llama()), runtime_dir=runtime, python=PYTHON, output=out, say=said.append
    )
    assert done.output == str(out) and done.quantize == "q8_0"
    assert done.architecture == "LlamaForCausalLM"
    assert not out.with_name("tiny.gguf.part").exists()
    facts = read_gguf(out)
    assert (facts.architecture, facts.file_type) == ("llama", "Q8_0")
    assert facts.chat_template  # the tokenizer's template came along
    assert done.bytes == out.stat().st_size
    assert any("convert_hf_to_gguf.py" in line for line in said)
    with serving(model=out) as url:
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=30,
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 4


def test_q4_k_m_is_quantized_from_bf16_by_llama_quantize(runtime: Path, tmp_path: Path) -> None:
    out = tmp_path / "tiny-q4.gguf"
    done = convert(
        str(tiny_llama()), runtime_dir=runtime, python=PYTHON, quantize="q4_k_m", output=out
    )
    assert read_gguf(out).file_type == "Q4_K_M"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["tiny-q4.gguf"]
    bf16 = convert(
        str(tiny_llama()),
        runtime_dir=runtime,
        python=PYTHON,
        quantize="bf16",
        output=tmp_path / "b.gguf",
    )
    assert read_gguf(Path(bf16.output)).file_type == "BF16"
    assert done.bytes < bf16.bytes


def test_a_quantizer_cut_short_resumes_from_the_kept_bf16_step(
    runtime: Path, tmp_path: Path
) -> None:
    """The quantizer killed half-way (SIGKILL, as the OOM killer or a reboot ends it): no
    result, the whole bf16 step kept with its stamp; the next conversion starts from it and
    leaves only the result. A model changed since is converted again."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (SERVER / "bin").iterdir():
        (bin_dir / tool.name).symlink_to(tool)
    (bin_dir / "llama").unlink()
    (bin_dir / "llama").write_text("#!/bin/sh\nkill -KILL $$\n")
    (bin_dir / "llama").chmod(0o755)
    (runtime / "bin").unlink()
    (runtime / "bin").symlink_to(bin_dir)
    model = tmp_path / "model"
    shutil.copytree(tiny_llama(), model)
    out = tmp_path / "out" / "m-q4.gguf"
    out.parent.mkdir()
    with pytest.raises(Refusal, match="llama quantize failed"):
        convert(str(model), runtime_dir=runtime, python=PYTHON, quantize="q4_k_m", output=out)
    whole = out.with_name(out.name + ".bf16")
    assert sorted(p.name for p in out.parent.iterdir()) == ["m-q4.gguf.bf16", "m-q4.gguf.bf16.json"]
    assert read_gguf(whole).file_type == "BF16"
    assert kept_step(whole, stamp_of(model, None))

    (bin_dir / "llama").unlink()
    (bin_dir / "llama").symlink_to(SERVER / "bin" / "llama")
    said: list[str] = []
    convert(
        str(model), runtime_dir=runtime, python=PYTHON, quantize="q4_k_m", output=out,
        say=said.append,
    )  # fmt: skip
    assert any(line.startswith("resume from") for line in said), said
    assert not any("to bf16" in line for line in said), said
    assert read_gguf(out).file_type == "Q4_K_M"
    assert [p.name for p in out.parent.iterdir()] == ["m-q4.gguf"]

    whole.write_bytes(b"a step of the model before it changed")
    whole.with_name(whole.name + ".json").write_text(stamp_of(model, None).model_dump_json())
    os.utime(model / "config.json", ns=(1, 1))
    assert not kept_step(whole, stamp_of(model, None))


def test_an_architecture_the_converter_lacks_is_refused_before_anything_runs(
    runtime: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_llama(), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(
        json.dumps({**config, "architectures": ["NoSuchForCausalLM"]})
    )
    out = tmp_path / "out.gguf"
    with pytest.raises(Refusal, match="does not take the architecture NoSuchForCausalLM") as caught:
        convert(str(model), runtime_dir=runtime, python=PYTHON, output=out)
    assert "config.json" in str(caught.value) and "vLLM" in str(caught.value)
    assert not out.exists()


def test_a_model_the_converter_fails_on_leaves_no_file(runtime: Path, tmp_path: Path) -> None:
    """The tiny BERT's WordPiece tokenizer was trained here: the converter's table of
    published tokenizers does not know it, and the converter stops half-way."""
    out = tmp_path / "embedder.gguf"
    with pytest.raises(ConverterRefused, match="does not know this model's tokenizer") as caught:
        convert(str(TINY_EMBEDDER), runtime_dir=runtime, python=PYTHON, output=out)
    assert "pre-tokenizer was not recognized" in str(caught.value)
    assert list(tmp_path.glob("embedder.gguf*")) == []


def test_a_python_without_torch_is_refused_with_the_fix(runtime: Path, tmp_path: Path) -> None:
    bare = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(Refusal, match="No module named 'torch'") as caught:
        convert(
            str(tiny_llama()),
            runtime_dir=runtime,
            python=str(bare / "bin/python"),
            output=tmp_path / "o.gguf",
        )
    assert "--python" in str(caught.value) and "install.sh --runtime" in str(caught.value)
    assert not (tmp_path / "o.gguf").exists()


def test_a_runtime_without_its_converter_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(Refusal, match=r"no llama\.cpp converter beside llama-server") as caught:
        installed_converter(tmp_path)
    assert "install.sh --engine llama.cpp" in str(caught.value)


def test_the_recipe_installs_the_converter_into_a_built_runtime_without_a_rebuild(
    tmp_path: Path,
) -> None:
    """A runtime the recipe built before it installed the converter (its binaries, stamp and
    kept source): the recipe run again installs the converter from the kept source, keeps
    the build, and a third run changes nothing."""
    llama_server()
    runtime = tmp_path / "llama-runtime"
    for part in ("bin", ".build"):
        shutil.copytree(SERVER / part, runtime / part, symlinks=True)
    shutil.copy2(SERVER / ".epyc-stamp", runtime / ".epyc-stamp")
    server_before = (runtime / "bin" / "llama-server").stat().st_mtime_ns
    recipe = [str(Path(REPO) / "packaging" / "llama-runtime.sh"), str(runtime)]
    done = subprocess.run(recipe, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "is provisioned" in done.stdout and "converter: " in done.stdout, done.stdout
    converter = installed_converter(runtime)
    assert (converter / "conversion" / "__init__.py").is_file()
    assert (converter / "gguf-py" / "gguf" / "__init__.py").is_file()
    assert (runtime / "bin" / "llama-server").stat().st_mtime_ns == server_before
    assert not (runtime / f"{CONVERTER_DIR}.part").exists()
    again = subprocess.run(recipe, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "converter: " not in again.stdout, again.stdout


def test_the_command_writes_json_and_refuses_with_exit_1(runtime: Path, tmp_path: Path) -> None:
    env = {**os.environ, "EPYCD_LLAMA_RUNTIME_DIR": str(runtime)}
    epycctl = str(Path(REPO) / ".venv" / "bin" / "epycctl")
    args = [epycctl, "convert", str(tiny_llama()), "--python", PYTHON, "--json"]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["output"] == str(tmp_path / "tiny-llama-Q8_0.gguf")
    assert set(answer) >= {"model", "architecture", "quantize", "bytes", "sha256", "llama_cpp"}
    assert "convert: " in done.stderr  # progress on stderr, never in the JSON
    refused = subprocess.run(
        [*args[:-1], "--output", str(tmp_path / "none" / "x.gguf"), "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert error.startswith(f"{tmp_path / 'none'}: --output: ") and "create it" in error


def epycctl_convert(
    runtime: Path, cwd: Path, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`epycctl convert ARGS --json`, bounded: a read that blocks fails the test, not hangs it."""
    env = {**os.environ, "EPYCD_LLAMA_RUNTIME_DIR": str(runtime)}
    epycctl = str(Path(REPO) / ".venv" / "bin" / "epycctl")
    argv = [epycctl, "convert", *args, "--python", PYTHON, "--json"]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def refused_json(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    answer = json.loads(done.stdout)
    assert set(answer) >= {"error"}, answer
    return str(answer["error"])


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("fifo", "FIFO"),
        ("dev-zero", "character device"),
        ("huge", "larger than 64 MiB"),
        ("not-object", "not an object"),
        ("architectures-text", "architectures"),
        ("architectures-numbers", "architectures"),
    ],
)
def test_a_hostile_config_json_is_refused_naming_the_file_and_key(
    runtime: Path, tmp_path: Path, kind: str, said: str
) -> None:
    """convert's config.json goes through epycd/readfile.py: a FIFO answers at once, /dev/zero
    and a huge file are not read past the cap, a wrong type names the key and the fix; exit
    2, one JSON object, nothing written."""
    model = tmp_path / "model"
    shutil.copytree(tiny_llama(), model)
    config = model / "config.json"
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    elif kind == "huge":
        with config.open("wb") as handle:
            handle.truncate(65 * 2**20)
    elif kind == "not-object":
        config.write_text('["LlamaForCausalLM"]')
    elif kind == "architectures-text":
        config.write_text('{"architectures": "LlamaForCausalLM"}')
    else:
        config.write_text('{"architectures": [1, 2]}')
    out = tmp_path / "out"
    out.mkdir()
    error = refused_json(epycctl_convert(runtime, out, str(model)), 2)
    assert error.startswith(f"{config}: "), error
    assert said in error, error
    if kind.startswith("architectures"):
        assert error.startswith(f"{config}: architectures: ") and "list" in error, error
    assert list(out.iterdir()) == []


def test_an_output_that_is_a_source_file_is_refused_and_the_source_kept(
    runtime: Path, tmp_path: Path
) -> None:
    """--output naming a file of the model (as given, through a symlink, or a hard link of
    it) would replace the weights or the config the conversion reads: refused before
    anything runs, the model as it was."""
    model = tmp_path / "model"
    shutil.copytree(tiny_llama(), model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    (tmp_path / "link.gguf").symlink_to(model / "config.json")
    os.link(model / "model.safetensors", tmp_path / "hard.gguf")
    for output in (
        model / "model.safetensors",
        model / "tokenizer.json",
        tmp_path / "link.gguf",
        tmp_path / "hard.gguf",
    ):
        error = refused_json(
            epycctl_convert(runtime, tmp_path, str(model), "--output", str(output)), 2
        )
        assert error.startswith(f"{output}: --output: "), error
        assert "the model's own" in error and "--output" in error, error
        assert {p.name: p.read_bytes() for p in model.iterdir()} == before, output
    with pytest.raises(InputError, match="would overwrite the model's own") as caught:
        convert(str(model), runtime_dir=runtime, python=PYTHON, output=model)  # the CLI says so too
    assert caught.value.key == "--output"
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.gguf", "link.gguf", "llama-runtime",
                                                          "model"]  # fmt: skip
