"""GGUF models: what a file says of itself, which engine serves it, and `check-model` on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import gguf
import pytest
from click.testing import CliRunner, Result
from gguf import GGMLQuantizationType, LlamaFileType

from epycd.cli import main
from epycd.engines import ENGINES
from epycd.engines.llama_cpp.model import format as llama_tables
from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import kv_bytes_per_token
from epycd.errors import InputError, Refusal
from epycd.model.check import inspect_model
from tests.model.gguf_files import CHAT_TEMPLATE, GgufShape, write_gguf
from tests.model.hf_cache import add_to_cache, commit_for

pytestmark = pytest.mark.usefixtures("offline_hub")


def run_json(*args: str) -> tuple[int, dict[str, Any], Result]:
    result = CliRunner().invoke(main, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout), result


def engine(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in data["engines"] if e["engine"] == name)


@pytest.mark.parametrize(
    ("file_type", "matrix_type"),
    [
        (LlamaFileType.MOSTLY_Q8_0, GGMLQuantizationType.Q8_0),
        (LlamaFileType.MOSTLY_Q4_0, GGMLQuantizationType.Q4_0),
        (LlamaFileType.MOSTLY_BF16, GGMLQuantizationType.BF16),
    ],
)
def test_read_gguf_gives_back_what_the_writer_wrote(
    tmp_path: Path, file_type: LlamaFileType, matrix_type: GGMLQuantizationType
) -> None:
    path = tmp_path / "m.gguf"
    shape = GgufShape(file_type=file_type, matrix_type=matrix_type, layers=2, context=8192)
    data_bytes = write_gguf(path, shape)
    facts = read_gguf(path)
    assert facts.architecture == "qwen2"
    assert facts.file_type == file_type.name.removeprefix("MOSTLY_")
    assert facts.tensor_types == {"F32": 2, matrix_type.name: 2}
    assert facts.tensors_bytes == data_bytes
    assert facts.size_bytes == path.stat().st_size > data_bytes
    assert (facts.context_length, facts.block_count, facts.head_count) == (8192, 2, 4)
    assert facts.head_count_kv == [2]
    assert facts.chat_template is True


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # head length from embedding / heads: 128 / 4 = 32, K and V, f16
        (GgufShape(layers=3, kv_heads=2), 3 * 2 * (32 + 32) * 2),
        # explicit key and value lengths win (MLA-style files give K != V)
        (GgufShape(layers=2, kv_heads=1, key_length=96, value_length=64), 2 * 1 * (96 + 64) * 2),
        # per-layer KV heads: summed layer by layer
        (GgufShape(layers=3, kv_heads=[2, 0, 4]), (2 + 0 + 4) * (32 + 32) * 2),
    ],
)
def test_kv_bytes_per_token_as_llama_cpp_allocates(
    tmp_path: Path, shape: GgufShape, expected: int
) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path, shape)
    assert kv_bytes_per_token(read_gguf(path)) == expected


def test_local_gguf_is_served_by_llama_cpp_not_vllm(tmp_path: Path) -> None:
    path = tmp_path / "chat-Q8_0.gguf"
    write_gguf(path, GgufShape())
    code, data, _ = run_json("check-model", str(path))
    assert code == 0
    assert data["format"] == "gguf"
    assert data["gguf"]["file_type"] == "Q8_0"
    assert data["weights_source"] == "gguf-tensors"
    assert data["kv_bytes_per_token"] == 768
    assert data["max_position_embeddings"] == 4096
    assert [e["engine"] for e in data["engines"]] == [e.name for e in ENGINES]
    assert engine(data, "llama.cpp")["supported"] is True
    assert engine(data, "llama.cpp")["version"] == llama_tables.pinned_version()
    assert engine(data, "vllm")["supported"] is False
    assert engine(data, "vllm")["reason"].endswith(
        "loads no GGUF weights (GGUF is GPU-only in vLLM's quantization table); "
        "serve it with llama.cpp"
    )
    assert data["primary_endpoint"] == "chat_completions"
    assert data["chat_template"]["source"] == "the GGUF file (tokenizer.chat_template)"
    assert data["message"].startswith("servable by llama.cpp")


def test_gguf_without_template_is_completions_only(tmp_path: Path) -> None:
    path = tmp_path / "base.gguf"
    write_gguf(path, GgufShape(chat_template=None))
    code, data, _ = run_json("check-model", str(path))
    assert code == 0
    assert data["primary_endpoint"] == "completions"
    assert data["supported_endpoints"] == ["completions"]
    assert "chat_template = <file>" in data["message"]


def test_endpoint_template_overrides_the_files(tmp_path: Path) -> None:
    path = tmp_path / "base.gguf"
    write_gguf(path, GgufShape(chat_template=None))
    template = tmp_path / "t.jinja"
    template.write_text(CHAT_TEMPLATE)
    facts = inspect_model(str(path), chat_template_override=str(template))
    assert facts.primary_endpoint == "chat_completions"
    assert facts.chat_template.source == "the endpoint file"


@pytest.mark.parametrize(
    ("architecture", "verdict", "kind"),
    [
        ("clip", "a vision encoder", "pooling"),
        ("no-such-arch", "does not know the architecture 'no-such-arch'", "unsupported"),
    ],
)
def test_what_llama_cpp_cannot_serve_is_refused(
    tmp_path: Path, architecture: str, verdict: str, kind: str
) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path, GgufShape(architecture=architecture))
    code, data, _ = run_json("check-model", str(path))
    assert code == 1
    assert engine(data, "llama.cpp") | {"supported": False, "kind": kind} == engine(
        data, "llama.cpp"
    )
    assert verdict in data["message"]
    assert data["launchable"] is False


@pytest.mark.parametrize("cut", [8, 200, 1000])
def test_a_truncated_file_is_bad_input_naming_it(tmp_path: Path, cut: int) -> None:
    whole = tmp_path / "whole.gguf"
    write_gguf(whole, GgufShape())
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole.read_bytes()[:cut])
    code, data, result = run_json("check-model", str(path))
    assert code == 2
    assert data["result"] == "error"
    assert str(path) in result.stderr
    assert "GGUF" in data["error"]


def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_gguf(fifo)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "read_gguf waited on a FIFO"
    assert isinstance(outcome[0], InputError)
    assert str(fifo) in str(outcome[0].file)


def test_a_hub_gguf_is_read_from_the_hf_cache(offline_hub: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "q4.gguf"
    write_gguf(scratch, GgufShape(file_type=LlamaFileType.MOSTLY_Q4_K_M))
    repo = "test-org/chat-GGUF"
    add_to_cache(offline_hub / "hub", repo, {"chat-Q4_K_M.gguf": scratch})
    code, data, _ = run_json("check-model", repo, "--gguf-file", "chat-Q4_K_M.gguf")
    assert code == 0
    assert data["revision"] == commit_for(repo)
    assert data["gguf"]["file"] == "chat-Q4_K_M.gguf"
    assert data["gguf"]["file_type"] == "Q4_K_M"
    assert Path(data["gguf"]["path"]).parent.name == commit_for(repo)


def test_a_hub_gguf_not_in_the_cache_names_the_download(offline_hub: Path) -> None:
    with pytest.raises(Refusal) as refused:
        inspect_model("test-org/absent-GGUF", gguf_file="absent-Q8_0.gguf", revision="v1")
    assert refused.value.key == "gguf_file"
    assert "hf download test-org/absent-GGUF absent-Q8_0.gguf --revision v1" in str(
        refused.value.fix
    )
    assert not (offline_hub / "hub" / "models--test-org--absent-GGUF").exists()


def test_a_hub_repository_without_a_file_name_asks_for_one() -> None:
    code, data, _ = run_json("check-model", "test-org/chat-GGUF", "--gguf-file", "")
    assert code == 2
    assert "--gguf-file" in data["error"]
    with pytest.raises(InputError) as bad:
        inspect_model("test-org/chat-GGUF.gguf")
    assert bad.value.key == "gguf_file"


def test_a_safetensors_model_names_both_engines() -> None:
    code, data, _ = run_json("check-model", "Qwen/Qwen3-0.6B")
    assert code == 0
    assert data["format"] == "safetensors"
    assert engine(data, "vllm")["supported"] is True
    assert engine(data, "llama.cpp")["supported"] is False
    assert "gguf_file" in engine(data, "llama.cpp")["reason"]


def test_the_table_covers_every_architecture_the_pinned_reader_names() -> None:
    """The gguf package and the llama.cpp source are pinned together: a reader newer than the
    table would name architectures the runtime is said not to know."""
    table = llama_tables.load_table(llama_tables.pinned_version())
    assert set(gguf.MODEL_ARCH_NAMES.values()) <= set(table.architectures)
    assert set(llama_tables.NOT_TEXT_GENERATION) <= set(table.architectures)
    assert set(llama_tables.EMBEDDERS) <= set(table.architectures)


def test_the_table_is_the_sources_own_map(tmp_path: Path) -> None:
    source = tmp_path / "llama.cpp" / llama_tables.ARCH_SOURCE
    source.parent.mkdir(parents=True)
    source.write_text(
        "static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n"
        '    { LLM_ARCH_LLAMA,   "llama"     },\n'
        '    { LLM_ARCH_QWEN2,   "qwen2"     }, // a comment\n'
        '    { LLM_ARCH_UNKNOWN, "(unknown)" },\n'
        "};\n"
        'static const std::map<llm_kv, const char *> LLM_KV_NAMES = { { LLM_KV_X, "x" } };\n'
    )
    converter = tmp_path / "llama.cpp" / llama_tables.CONVERTER_MAP_SOURCE
    converter.parent.mkdir(parents=True)
    converter.write_text(
        'TEXT_MODEL_MAP: dict[str, str] = {\n    "QwenForLM": "qwen",\n'
        '    "LlamaForLM": "llama",\n}\n'
        'MMPROJ_MODEL_MAP: dict[str, str] = {"VisionModel": "vision"}\n'
    )
    table = llama_tables.build_table(tmp_path, "9.9")
    assert table.architectures == ["llama", "qwen2"]
    assert table.converts == ["LlamaForLM", "QwenForLM"], "the text map alone, sorted"
    source.write_text("no map here\n")
    with pytest.raises(InputError):
        llama_tables.build_table(tmp_path, "9.9")


@pytest.mark.parametrize("command", ["plan", "approve", "status", "stop"])
def test_commands_that_never_read_a_gguf_file_do_not_load_its_reader(command: str) -> None:
    """`gguf` brings numpy (about 0.1 s): only the commands that read a file may pay for it."""
    probe = (
        "import sys\n"
        "from epycd.cli import main\n"
        f"main([{command!r}, '--help'], standalone_mode=False)\n"
        "print('LOADED', [m for m in ('gguf', 'numpy') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "LOADED []"


@pytest.mark.parametrize(
    ("architecture", "pooling", "head", "kind", "primary", "said"),
    [
        ("bert", None, None, "embedding", "embeddings", "bert is an embedding encoder"),
        ("qwen2", 3, None, "embedding", "embeddings", "an embedder (last pooling)"),
        ("qwen2", 4, None, "rerank", "rerank", "a reranker: /v1/rerank (--rerank)"),
        ("qwen2", 0, None, "text", "chat_completions", "servable by llama.cpp"),
        ("bert", None, 1, "rerank", "rerank", "with a one-output classifier head is a reranker"),
        ("bert", None, 3, "embedding", "embeddings", "bert is an embedding encoder"),
        ("bert", 1, 1, "embedding", "embeddings", "bert is an embedding encoder"),
    ],
)
def test_embedders_and_rerankers_are_known_by_architecture_pooling_type_and_head(
    tmp_path: Path,
    architecture: str,
    pooling: int | None,
    head: int | None,
    kind: str,
    primary: str,
    said: str,
) -> None:
    """A file's pooling type decides; without one, a one-output classifier head (as llama.cpp's
    converter writes a reranker) makes a reranker, a head of more labels does not."""
    path = tmp_path / "m.gguf"
    extra = {} if pooling is None else {"{arch}.pooling_type": pooling}
    matrices = {} if head is None else {"cls.output.weight": (GGMLQuantizationType.F32, head, 128)}
    write_gguf(path, GgufShape(architecture=architecture, extra=extra, matrices=matrices))
    code, data, _ = run_json("check-model", str(path))
    assert code == 0
    assert engine(data, "llama.cpp")["kind"] == kind
    assert engine(data, "llama.cpp")["supported"] is True
    assert data["primary_endpoint"] == primary
    assert said in data["message"]
    names = {None: None, 0: "none", 1: "mean", 3: "last", 4: "rank"}
    assert read_gguf(path).pooling_type == names[pooling]
    assert read_gguf(path).classifier_outputs == head
