"""The memory terms of a llama.cpp endpoint (epycd.engines.llama_cpp.model.memory,
epycd.engines.llama_cpp.plan.decide)
and `epycctl estimate` of a GGUF file. The compute buffer's formula is held to every case
llama-server logged in benchmarks/llama-compute-run1.json (benchmarks/llama_compute.py);
tests/llama/test_real_llama_server.py holds all the terms to the real server of this machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from epycd.cli import main
from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import (
    UnmeasuredModel,
    compute_bytes,
    kv_bytes_per_token,
    llama_memory,
    padded_cells,
    repacked_bytes,
)
from epycd.engines.llama_cpp.plan.decide import fit_llama
from epycd.sizes import GIB
from tests.model.gguf_files import GgufShape, write_gguf
from tests.sandbox import REPO

Q = GGMLQuantizationType
RUN = REPO / "benchmarks" / "llama-compute-run1.json"
MIB = 1024**2


def matrix_bytes(kind: GGMLQuantizationType, rows: int, columns: int) -> int:
    block, type_size = GGML_QUANT_SIZES[kind]
    return rows * columns // block * type_size


MATRICES = {
    "token_embd.weight": (Q.Q4_0, 64, 128),  # looked up by row: never repacked
    "blk.0.ffn_up.weight": (Q.Q4_0, 256, 128),
    "blk.0.ffn_gate.weight": (Q.Q4_K, 256, 256),
    "blk.0.ffn_down.weight": (Q.Q2_K, 128, 256),
    "blk.0.odd.weight": (Q.Q4_0, 12, 128),  # 12 rows: not in blocks of 8
}


def model(tmp_path: Path, **changes: Any) -> Path:
    shape = GgufShape(
        layers=2, embedding=128, heads=4, kv_heads=2, feed_forward=512, vocab=300, **changes
    )
    path = tmp_path / "m.gguf"
    write_gguf(path, shape)
    return path


def test_the_repackable_matrices_are_read_from_the_tensor_table(tmp_path: Path) -> None:
    gguf = read_gguf(model(tmp_path, matrices=MATRICES))
    q8_attention = 2 * matrix_bytes(Q.Q8_0, 128, 128)  # write_gguf's attn_q of each layer
    assert gguf.repackable_bytes == {
        "Q8_0": q8_attention,
        "Q4_K": matrix_bytes(Q.Q4_K, 256, 256),
        "Q4_0": matrix_bytes(Q.Q4_0, 256, 128),
        "Q2_K": matrix_bytes(Q.Q2_K, 128, 256),
    }
    assert (gguf.feed_forward_length, gguf.vocab_size) == (512, 300)


@pytest.mark.parametrize(
    ("flags", "types"),
    [
        ([], ()),
        (["sse4_2", "avx"], ()),
        (["avx", "avx2"], (Q.Q4_0, Q.Q4_K)),
        (["avx2", "avx512f", "avx512_bf16"], (Q.Q4_0, Q.Q4_K, Q.Q2_K)),
    ],
)
def test_which_types_are_repacked_depends_on_the_cpu(
    tmp_path: Path, flags: list[str], types: tuple[GGMLQuantizationType, ...]
) -> None:
    gguf = read_gguf(model(tmp_path, matrices=MATRICES))
    expected = sum(gguf.repackable_bytes[kind.name] for kind in types)
    assert repacked_bytes(gguf, flags) == expected


def test_kv_output_and_cells_of_one_unified_pool(tmp_path: Path) -> None:
    gguf = read_gguf(model(tmp_path))
    memory = llama_memory(gguf, context=1000, slots=3, cpu_flags=["avx2"])
    assert memory.cells == padded_cells(3000) == 3072
    assert memory.kv_bytes == 3072 * (kv_bytes_per_token(gguf) or 0)
    assert memory.output_bytes == 300 * 3 * 4
    assert memory.weights_bytes == gguf.tensors_bytes
    assert memory.total_bytes == sum(
        getattr(memory, f"{term}_bytes")
        for term in ("weights", "repacked", "kv", "compute", "output", "server")
    )


def measured_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(RUN.read_text())["rows"]
    return [row for row in rows if "CPU compute" in row["logged_mib"]]


@pytest.mark.parametrize(
    "row", measured_rows(), ids=lambda r: f"{r['model']}-{r['cells']}x{r['slots']}x{r['ubatch']}"
)
def test_the_compute_formula_holds_every_logged_case(tmp_path: Path, row: dict[str, Any]) -> None:
    """Exact to the log's 0.01 MiB, or above it (never below: a fit must not fall short)."""
    shape = GgufShape(
        architecture=row["architecture"],
        layers=row["layers"],
        embedding=row["hidden"],
        heads=row["heads"],
        key_length=row["key_length"],
        value_length=row["key_length"],
        feed_forward=row["ffn"],
        vocab=8,
    )
    path = tmp_path / "shape.gguf"
    write_gguf(path, shape)
    ours = compute_bytes(read_gguf(path), row["cells"], row["ubatch"])
    assert ours is not None
    logged = row["logged_mib"]["CPU compute"]
    assert round(ours / MIB, 2) >= logged, row
    if row["model"] not in OVER:
        assert round(ours / MIB, 2) == logged, row
    assert row["logged_mib"]["CPU output"] == round(row["vocab"] * row["slots"] * 4 / MIB, 2)


ENCODER_RUN = REPO / "benchmarks" / "llama-compute-encoder-run1.json"
ENCODER_MARGIN = 0.03
"""The encoder formula's most above the log, as a share (2.1 % at most in the run)."""


def encoder_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(ENCODER_RUN.read_text())["rows"]
    return rows


@pytest.mark.parametrize(
    "row", encoder_rows(), ids=lambda r: f"{r['model']}-{r['cells']}x{r['slots']}x{r['ubatch']}"
)
def test_the_encoder_formula_holds_every_logged_case(tmp_path: Path, row: dict[str, Any]) -> None:
    """A BERT encoder's buffers as llama-server logged them serving embeddings: the compute
    formula never below and at most 3 % above, no KV cache, the output exact with the
    embedding beside the logits of each slot."""
    path = tmp_path / "bert.gguf"
    shape = GgufShape(architecture="bert", layers=row["layers"], embedding=row["hidden"],
                      heads=row["heads"], feed_forward=row["ffn"], vocab=row["vocab"])  # fmt: skip
    write_gguf(path, shape)
    memory = llama_memory(read_gguf(path), context=row["cells"], slots=row["slots"],
                          ubatch=row["ubatch"], cpu_flags=[], shared_pool=True,
                          embeddings=True)  # fmt: skip
    logged = row["logged_mib"]
    assert memory.compute_bytes / MIB >= logged["CPU compute"], row
    assert memory.compute_bytes / MIB <= logged["CPU compute"] * (1 + ENCODER_MARGIN), row
    assert memory.kv_bytes == 0 and "CPU KV" not in logged
    assert round(memory.output_bytes / MIB, 2) == logged["CPU output"]


def test_the_encoder_run_spans_the_shapes_and_batches_it_claims() -> None:
    rows = encoder_rows()
    assert len({row["model"] for row in rows}) >= 14
    assert {row["ubatch"] for row in rows} >= {256, 512, 1024, 2048}
    assert {row["ffn"] / row["hidden"] for row in rows} >= {1, 2, 4, 8}


OVER = {"qwen2-h3072-f2048-L2", "qwen3-h1024-L2"}
"""The shapes whose server reserves less than the formula (the FFN narrower than the
hidden size; a 2-layer qwen3 whose attention is wider than its hidden size)."""


def test_every_repack_logged_is_ours() -> None:
    rows = [row for row in json.loads(RUN.read_text())["rows"] if "-Q" in row["model"]]
    assert rows, "the run measured no quantized file"
    for row in rows:
        assert row["logged_mib"].get("CPU_REPACK model", 0.0) == row["ours_mib"]["repack"], row


def test_an_architecture_not_measured_is_not_guessed(tmp_path: Path) -> None:
    gguf = read_gguf(model(tmp_path, architecture="gemma3"))
    assert compute_bytes(gguf, 4096, 512) is None
    with pytest.raises(UnmeasuredModel, match="not gemma3"):
        llama_memory(gguf, context=4096, slots=1, cpu_flags=[])


def test_the_suggested_context_is_the_largest_that_fits(tmp_path: Path) -> None:
    gguf = read_gguf(model(tmp_path, context=1_000_000))
    fit = fit_llama(
        gguf, context=1_000_000, slots=4, cpu_flags=["avx2"], total_gib=3.0, available_gib=2.1
    )
    assert not fit.fits and fit.suggested_context, fit
    assert fit.suggested_context % 256 == 0

    def at(context: int) -> bool:
        return fit_llama(
            gguf, context=context, slots=4, cpu_flags=["avx2"], total_gib=3.0, available_gib=2.1
        ).fits

    assert at(fit.suggested_context)
    assert not at(fit.suggested_context + 256)


def test_no_context_is_suggested_when_the_weights_alone_do_not_fit(tmp_path: Path) -> None:
    gguf = read_gguf(model(tmp_path))
    fit = fit_llama(gguf, context=4096, slots=1, cpu_flags=[], total_gib=2.0, available_gib=2.0)
    assert not fit.fits and fit.suggested_context is None
    assert "weights alone" in fit.action


def estimate(*args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["estimate", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.usefixtures("offline_hub")
def test_estimate_sizes_llama_server_for_a_gguf_file(tmp_path: Path) -> None:
    path = model(tmp_path)
    code, data = estimate(str(path), "--socket-gb", "64", "--max-model-len", "2048")
    assert code == 0, data
    assert (data["engine"], data["gguf_file"], data["fits"]) == ("llama.cpp", "m.gguf", True)
    assert (data["context"], data["slots"]) == (2048, 4)
    memory = data["memory"]
    assert memory["cells"] == 8192
    assert memory["kv_bytes"] == 8192 * (kv_bytes_per_token(read_gguf(path)) or 0)
    assert data["required_gb"] == pytest.approx(memory_total(memory) / GIB + 6.4, abs=0.01)


def memory_total(memory: dict[str, int]) -> int:
    return sum(v for k, v in memory.items() if k.endswith("_bytes"))


@pytest.mark.usefixtures("offline_hub")
def test_estimate_of_a_gguf_that_does_not_fit_says_what_would(tmp_path: Path) -> None:
    path = model(tmp_path, context=1_000_000)
    code, data = estimate(str(path), "--socket-gb", "2.2", "--max-num-seqs", "8")
    assert code == 1, data
    assert data["fits"] is False and data["suggested_context"], data
    code, refit = estimate(
        str(path), "--socket-gb", "2.2", "--max-num-seqs", "8",
        "--max-model-len", str(data["suggested_context"]),
    )  # fmt: skip
    assert (code, refit["fits"]) == (0, True), refit


@pytest.mark.usefixtures("offline_hub")
def test_estimate_refuses_what_it_cannot_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no llama.cpp runtime to ask, an architecture the formulas do not cover is refused
    with the runtime's build as the fix."""
    monkeypatch.setenv("EPYCD_LLAMA_RUNTIME_DIR", str(tmp_path / "no-runtime"))
    code, data = estimate(str(model(tmp_path, architecture="gemma3")), "--socket-gb", "64")
    assert code == 1 and "measured for" in data["error"], data
    assert "build the llama.cpp runtime" in data["error"], data
    code, data = estimate(str(model(tmp_path)), "--socket-gb", "64", "--max-model-len", "9000")
    assert code == 2 and "4096 tokens the model was trained for" in data["error"], data


@pytest.mark.usefixtures("offline_hub")
def test_estimate_of_a_gguf_file_for_people(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["estimate", str(model(tmp_path)), "--socket-gb", "64"])
    assert result.exit_code == 0, result.output
    rows = dict(line.split(None, 1) for line in result.output.splitlines() if "  " in line)
    assert rows["engine"].strip() == "llama.cpp (llama-server)"
    assert rows["fits"].strip() == "yes"
    assert result.output.splitlines()[-1] == "fits: 4 slots of 4096 tokens"
