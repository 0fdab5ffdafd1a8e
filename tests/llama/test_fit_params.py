"""llama.cpp's own memory accounting read from the pinned build (`llama fit-params`,
epycd/engines/llama_cpp/plan/fit.py): on the tiny models of the four architectures the
formulas were measured on, the terms that are the same quantity agree with the formulas
(epycd/engines/llama_cpp/model/memory.py); the published Gemma 3 270M, which the formulas
refuse, gets terms; a file llama.cpp cannot load is refused with llama.cpp's own reason."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import psutil
import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
from llama_shape_model import Shape, write

from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import UnmeasuredModel, llama_memory
from epycd.engines.llama_cpp.plan.fit import (
    RESOLUTION_BYTES,
    FitSettings,
    LlamaCppMemory,
    combined_binary,
    llama_cpp_memory,
    llama_server_memory,
    server_memory,
)
from epycd.engines.llama_cpp.plan.model import LlamaInvocation, llama_server_argv
from epycd.errors import Refusal
from tests.health.realvllm import free_port
from tests.llama.realllama import (
    copy_gguf,
    llama_server,
    published_gemma,
    tiny_bert_gguf,
    tiny_gguf,
)
from tests.machine import real_cpu

pytestmark = pytest.mark.llama

TINY_SHAPES = {
    # the tiny qwen2's dimensions and tokenizer, as the other two architectures
    "llama": (Shape("llama", "tiny-vocab.gguf", 128, 2, 4, 2, 256, 2048, 1e4, True, False), None),
    "qwen3": (
        Shape("qwen3", "tiny-vocab.gguf", 128, 2, 4, 2, 384, 2048, 1e6, True, False, True),
        64,
    ),
}
SETTINGS = [(1024, 4, 512), (4096, 1, 512), (2048, 2, 256)]
"""Context, slots, ubatch: each slot's share a multiple of 256 cells, so that fit-params'
one stream per slot holds the cells of the plan's one unified pool."""
COMPUTE_ABOVE = 1.25
"""The compute formula is exact to llama-server's log or above it, by at most 23 % (qwen3 of
a narrow FFN: docs/tuning.md rule 9)."""


def llama() -> str:
    return combined_binary(str(llama_server()))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A GGUF file of each architecture the formulas were measured on: the cache's tiny qwen2
    and BERT, and a llama and a qwen3 of the same size written with the gguf package."""
    folder = tmp_path_factory.mktemp("fit")
    (folder / "models").mkdir()
    (folder / "models" / "tiny-vocab.gguf").symlink_to(tiny_gguf("q8_0"))
    files = {"qwen2": tiny_gguf("q8_0"), "qwen2-bf16": tiny_gguf("bf16")}
    for name, (shape, head_dim) in TINY_SHAPES.items():
        files[name] = folder / f"tiny-{name}.gguf"
        write(folder, shape, files[name], head_dim=head_dim)
    files["bert"] = tiny_bert_gguf("embedder")
    return files


def within_resolution(told: int, exact: int) -> bool:
    """llama.cpp prints whole MiB rounded down."""
    return 0 <= exact - told < RESOLUTION_BYTES


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen2-bf16", "qwen3", "bert"])
@pytest.mark.parametrize(("context", "slots", "ubatch"), SETTINGS)
def test_llama_cpp_terms_agree_with_the_measured_formulas(
    tiny_files: dict[str, Path], name: str, context: int, slots: int, ubatch: int
) -> None:
    model = tiny_files[name]
    gguf = read_gguf(model)
    encoder = gguf.architecture == "bert"
    if encoder:  # an embedder reads its input whole: context, batch and ubatch alike
        context = ubatch = 512
    settings = FitSettings(
        context=context, slots=slots, ubatch=ubatch, batch=ubatch if encoder else 2048
    )
    told = llama_cpp_memory(llama(), model, settings)
    formula = llama_memory(
        gguf,
        context=context,
        slots=slots,
        cpu_flags=real_cpu().flags,
        ubatch=ubatch,
        shared_pool=True,
        embeddings=encoder,
    )
    assert told.fits_free_memory
    assert within_resolution(told.repacked_bytes, formula.repacked_bytes)
    weights = told.weights_bytes + told.repacked_bytes
    assert 0 <= formula.weights_bytes - weights < 2 * RESOLUTION_BYTES
    assert within_resolution(told.context_bytes, formula.kv_bytes)
    if slots == 1:
        # one slot: fit-params' one stream is the server's pool, and a tiny vocabulary's
        # logits are smaller than a layer's activations, so its compute is the server's
        assert told.compute_bytes <= formula.compute_bytes
        assert formula.compute_bytes <= COMPUTE_ABOVE * (told.compute_bytes + RESOLUTION_BYTES)


def test_the_published_gemma_the_formulas_refuse_gets_llama_cpps_terms() -> None:
    model = published_gemma()
    gguf = read_gguf(model)
    with pytest.raises(UnmeasuredModel, match="gemma3"):
        llama_memory(gguf, context=4096, slots=4, cpu_flags=real_cpu().flags, shared_pool=True)
    told = llama_cpp_memory(llama(), model, FitSettings(context=4096, slots=4))
    assert isinstance(told, LlamaCppMemory)
    assert 0 <= gguf.tensors_bytes - told.weights_bytes - told.repacked_bytes < 2 * RESOLUTION_BYTES
    flags = real_cpu().flags
    if "avx2" in flags:  # the Q4_K matrices, repacked (12.66 MiB)
        assert told.repacked_bytes == 12 * RESOLUTION_BYTES
    # 3 global layers of 4 x 1024 cells and 15 sliding-window layers of 4 x 1024
    assert told.context_bytes == 72 * RESOLUTION_BYTES
    assert told.compute_bytes > 0


def test_fit_params_counts_the_logits_of_a_whole_ubatch() -> None:
    """Why fit-params is not yet the plan's figure (docs/tuning.md rule 9): its compute holds
    the logits of every token of a ubatch, 262,144 x 512 x 4 B for Gemma, where llama-server
    reserves one output per slot and allocates 24.27 MiB at these settings."""
    model = published_gemma()
    vocab = read_gguf(model).vocab_size
    assert vocab
    told = llama_cpp_memory(llama(), model, FitSettings(context=4096, slots=4, ubatch=512))
    assert told.compute_bytes >= vocab * 512 * 4


def unknown_architecture(source: Path, out: Path) -> Path:
    """The tiny qwen2's keys and tensors under an architecture llama.cpp does not know."""
    return copy_gguf(source, out, architecture="nosucharch")


def test_a_file_llama_cpp_cannot_load_is_refused_with_its_reason(tmp_path: Path) -> None:
    settings = FitSettings(context=1024, slots=1)
    model = unknown_architecture(tiny_gguf("q8_0"), tmp_path / "odd.gguf")
    with pytest.raises(Refusal) as refused:
        llama_cpp_memory(llama(), model, settings)
    said = str(refused.value)
    assert str(model) in said and "unknown model architecture: 'nosucharch'" in said

    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    with pytest.raises(Refusal, match="invalid magic characters") as refused:
        llama_cpp_memory(llama(), text, settings)
    assert refused.value.file == str(text)


def test_a_missing_combined_binary_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(Refusal, match="did not answer") as refused:
        llama_cpp_memory(
            str(tmp_path / "llama"), tiny_gguf("q8_0"), FitSettings(context=1024, slots=1)
        )
    assert refused.value.file == str(tiny_gguf("q8_0"))


# --- llama-server's own pass: the plan's exact words, --fit on, killed at its end -----------


def server_words(model: Path, context: int, slots: int, ubatch: int, port: int) -> list[str]:
    """The words the plan gives llama-server (`llama_server_argv`) for these settings."""
    encoder = read_gguf(model).architecture == "bert"
    invocation = LlamaInvocation(
        model_path=str(model), alias="probe", host="127.0.0.1", port=port, threads=2,
        slots=slots, context=context, ubatch=ubatch, cache_ram_mib=0, load_mode="mmap",
        pooling="embedding" if encoder else None,
    )  # fmt: skip
    return llama_server_argv(invocation)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen2-bf16", "qwen3", "bert"])
@pytest.mark.parametrize(("context", "slots", "ubatch"), SETTINGS)
def test_llama_servers_own_pass_agrees_with_the_measured_formulas(
    tiny_files: dict[str, Path], name: str, context: int, slots: int, ubatch: int
) -> None:
    """At the plan's own words (one unified pool, one output per slot) every term is the one
    the formulas were measured against: weights, repacked, KV to llama.cpp's MiB, compute
    exact or above by the formula's measured margin."""
    model = tiny_files[name]
    gguf = read_gguf(model)
    encoder = gguf.architecture == "bert"
    if encoder:
        context = ubatch = 512
    words = server_words(model, context, slots, ubatch, free_port())
    told = llama_server_memory(str(llama_server()), model, words)
    formula = llama_memory(
        gguf, context=context, slots=slots, cpu_flags=real_cpu().flags, ubatch=ubatch,
        shared_pool=True, embeddings=encoder,
    )  # fmt: skip
    assert told.fits_free_memory is None
    assert within_resolution(told.repacked_bytes, formula.repacked_bytes)
    assert (
        0 <= formula.weights_bytes - told.weights_bytes - told.repacked_bytes < 2 * RESOLUTION_BYTES
    )
    assert within_resolution(told.context_bytes, formula.kv_bytes)
    assert told.compute_bytes <= formula.compute_bytes
    assert formula.compute_bytes <= COMPUTE_ABOVE * (told.compute_bytes + RESOLUTION_BYTES)


def test_llama_servers_pass_gives_gemma_the_servers_terms_not_fit_params() -> None:
    """The published Gemma at 4096 cells for 2 slots: the server's pass reserves one output
    per slot (compute about 23 MiB where fit-params holds a ubatch of logits, over 512 MiB) and
    one unified pool (less KV than fit-params' stream per slot)."""
    model = published_gemma()
    words = server_words(model, 4096, 2, 512, free_port())
    server = llama_server_memory(str(llama_server()), model, words)
    tool = llama_cpp_memory(llama(), model, FitSettings(context=4096, slots=2))
    assert server.weights_bytes == tool.weights_bytes
    assert server.repacked_bytes == tool.repacked_bytes
    vocab = read_gguf(model).vocab_size
    assert vocab
    assert server.compute_bytes < vocab * 512 * 4 <= tool.compute_bytes
    assert 0 < server.context_bytes < tool.context_bytes


def test_llama_servers_pass_binds_no_port_and_leaves_no_process() -> None:
    """Killed at the pass's end line: the port the words name stays free, the weights are never
    loaded, and no llama-server outlives the question."""
    port = free_port()
    model = published_gemma()
    llama_server_memory(str(llama_server()), model, server_words(model, 4096, 2, 512, port))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # still free: nothing listened there
    alive = [p for p in psutil.process_iter(["cmdline"]) if str(port) in (p.info["cmdline"] or [])]
    assert alive == []


def test_llama_servers_pass_refuses_a_file_it_cannot_load_with_its_reason(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    words = server_words(tiny_gguf("q8_0"), 1024, 1, 512, free_port())
    words[words.index("--model") + 1] = str(text)
    with pytest.raises(Refusal, match="invalid magic characters") as refused:
        llama_server_memory(str(llama_server()), text, words)
    assert refused.value.file == str(text)


def test_a_refusal_is_kept_until_the_file_or_the_server_changes(tmp_path: Path) -> None:
    """epycd plans again at each reconcile: a file llama.cpp cannot account is not asked of the
    server each time, only again once the file (or the server) changed."""
    asked = tmp_path / "asked"
    server = tmp_path / "llama-server"
    server.write_text(f"#!/bin/sh\necho asked >> {asked}\n")  # says no table, exit 0
    server.chmod(0o755)
    model = tiny_gguf("q8_0")
    copy = tmp_path / "tiny.gguf"
    copy.write_bytes(model.read_bytes())
    words = server_words(copy, 1024, 1, 512, free_port())
    for _ in range(3):
        with pytest.raises(Refusal, match="printed no memory breakdown"):
            server_memory(str(server), copy, words)
    assert asked.read_text().count("asked") == 1
    os.utime(copy, ns=(0, 0))
    with pytest.raises(Refusal):
        server_memory(str(server), copy, words)
    assert asked.read_text().count("asked") == 2
