"""llama-server's own buffers for model shapes and settings, against epycd's llama.cpp memory
terms (`epycd.engines.llama_cpp.model.memory`): the compute buffer's formula, the KV cache,
the output buffer and the repacked matrices, from the server's log, without running a request.

Run:  .venv/bin/python benchmarks/llama_compute.py --runtime DEST --source LLAMA_CPP_DIR \\
          --models /tmp/llama-shapes --out benchmarks/llama-compute-run1.json
      (with --encoders: the BERT encoder shapes, --out benchmarks/llama-compute-encoder-run1.json)
(DEST: a runtime of packaging/llama-runtime.sh; LLAMA_CPP_DIR: its pinned source, unpacked
from DEST/.build/download, for the vocab-only GGUF files the shapes copy their tokenizers from.)

Each shape is written by benchmarks/llama_shape_model.py with random bf16 weights (2 to 8
layers: the compute buffer stops growing after the first layers, so a few show a deep model's
figure), quantized copies by the runtime's own `llama quantize`; each case starts llama-server
with `-c CELLS -np SLOTS -ub UBATCH --kv-unified --fit off -lv 4`, reads the buffer sizes it
logs while loading, and stops it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from llama_shape_model import EncoderShape, Shape, write, write_encoder  # noqa: E402

from epycd.engines.llama_cpp.model.gguf import read_gguf  # noqa: E402
from epycd.engines.llama_cpp.model.memory import compute_bytes, repacked_bytes  # noqa: E402

BUFFER = re.compile(
    r"(CPU(?:_REPACK|_Mapped)?)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB"
)
MIB = 1024**2

# name: (architecture, vocabulary file, hidden, heads, KV heads, FFN, layers, head size or None)
SHAPES: dict[str, tuple[str, str, int, int, int, int, int, int | None]] = {
    "qwen2-h896-L4": ("qwen2", "ggml-vocab-qwen2.gguf", 896, 14, 2, 4864, 4, None),
    "qwen2-h896-L8": ("qwen2", "ggml-vocab-qwen2.gguf", 896, 14, 2, 4864, 8, None),
    "qwen2-h1536-L4": ("qwen2", "ggml-vocab-qwen2.gguf", 1536, 12, 2, 8960, 4, None),
    "qwen2-h2048-L4": ("qwen2", "ggml-vocab-qwen2.gguf", 2048, 16, 8, 5632, 4, None),
    "qwen2-h512-f4096-L2": ("qwen2", "ggml-vocab-qwen2.gguf", 512, 8, 8, 4096, 2, None),
    "qwen2-h3072-f2048-L2": ("qwen2", "ggml-vocab-qwen2.gguf", 3072, 24, 8, 2048, 2, None),
    "llama-h2048-L2": ("llama", "ggml-vocab-llama-bpe.gguf", 2048, 32, 8, 8192, 2, None),
    "llama-h1024-f3072-L4": ("llama", "ggml-vocab-llama-bpe.gguf", 1024, 16, 4, 3072, 4, None),
    "qwen3-h1024-L2": ("qwen3", "ggml-vocab-qwen2.gguf", 1024, 16, 8, 3072, 2, 128),
    "qwen3-h2560-L2": ("qwen3", "ggml-vocab-qwen2.gguf", 2560, 32, 8, 9728, 2, 128),
}
# name: (hidden, heads, FFN, layers): BERT encoders (the FFN 4x hidden as all-MiniLM, bge-small,
# bge-base and bge-large have it, and narrower and wider ones), 512 positions
ENCODER_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "bert-h128-f256-L2": (128, 4, 256, 2),
    "bert-h384-f1536-L2": (384, 12, 1536, 2),
    "bert-h384-f1536-L6": (384, 12, 1536, 6),
    "bert-h768-f3072-L2": (768, 12, 3072, 2),
    "bert-h1024-f4096-L2": (1024, 16, 4096, 2),
    "bert-h384-f768-L2": (384, 12, 768, 2),
    "bert-h384-f384-L2": (384, 12, 384, 2),
    "bert-h384-f3072-L2": (384, 12, 3072, 2),
    "bert-h384-a6-f1536-L2": (384, 6, 1536, 2),
    "bert-h256-f512-L2": (256, 4, 512, 2),
    "bert-h512-f1024-L2": (512, 8, 1024, 2),
    "bert-h128-f512-L2": (128, 4, 512, 2),
    "bert-h64-f128-L2": (64, 2, 128, 2),
    "bert-h1024-f4096-L4": (1024, 16, 4096, 4),
}
# (cells, slots, ubatch): an encoder reads an input in one ubatch (the plan's ubatch is the
# context); its cells hold nothing (no KV cache)
ENCODER_CASES = [(512, 1, 512), (512, 4, 512), (512, 8, 512), (2048, 4, 512), (256, 4, 256),
                 (1024, 4, 1024), (2048, 4, 2048)]  # fmt: skip
QUANTIZED = {"qwen2-h896-L4": ("Q4_0", "Q4_K_M"), "llama-h1024-f3072-L4": ("Q4_0", "Q4_K_M")}
# (cells, slots, ubatch)
CASES = [
    (4096, 1, 512),
    (16384, 1, 512),
    (4096, 4, 512),
    (4096, 1, 256),
    (4096, 1, 1024),
    (8192, 8, 512),
]


def logged_buffers(
    server: Path, model: Path, cells: int, slots: int, ubatch: int, *, encoder: bool = False
) -> dict[str, float]:
    batch = ["--embeddings", "-b", str(ubatch)] if encoder else ["-b", str(max(ubatch, 2048))]
    argv = [
        str(server), "-m", str(model), "-c", str(cells), "-np", str(slots), "-ub", str(ubatch),
        *batch, "--kv-unified", "--cache-ram", "0", "--fit", "off",
        "-t", "1", "--host", "127.0.0.1", "--port", "18990", "--no-webui", "-lv", "4",
    ]  # fmt: skip
    found: dict[str, float] = {}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if match := BUFFER.search(line):
                found[f"{match.group(1)} {match.group(2)}"] = float(match.group(3))
            if "compute buffer size" in line or time.monotonic() > deadline:
                break
    finally:
        process.kill()
        process.wait()
    return found


def model_files(args: argparse.Namespace) -> list[tuple[str, Path]]:
    files = []
    for name, (arch, vocab, hidden, heads, kv, ffn, layers, head) in SHAPES.items():
        path = args.models / f"{name}.gguf"
        if not path.exists():
            shape = Shape(arch, vocab, hidden, layers, heads, kv, ffn, 32768, 1e6, True,
                          arch == "qwen2", arch == "qwen3")  # fmt: skip
            write(args.source, shape, path, head_dim=head)
        files.append((name, path))
        for kind in QUANTIZED.get(name, ()):
            quantized = args.models / f"{name}-{kind}.gguf"
            if not quantized.exists():
                llama = str(args.runtime / "bin" / "llama")
                quantize = [llama, "quantize", str(path), str(quantized), kind]
                subprocess.run(quantize, check=True, capture_output=True)
            files.append((f"{name}-{kind}", quantized))
    return files


def encoder_files(args: argparse.Namespace) -> list[tuple[str, Path]]:
    files = []
    for name, (hidden, heads, ffn, layers) in ENCODER_SHAPES.items():
        path = args.models / f"{name}.gguf"
        if not path.exists():
            write_encoder(args.source, EncoderShape(hidden, layers, heads, ffn), path)
        files.append((name, path))
    return files


def cpuinfo(key: str) -> list[str]:
    """Every value of `key` in /proc/cpuinfo, one per CPU."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return [ln.split(":", 1)[1].strip() for ln in lines if ln.split(":", 1)[0].strip() == key]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", type=Path, required=True)
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--models", type=Path, required=True, help="where the shapes are written")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--encoders", action="store_true", help="the BERT encoder shapes, served --embeddings"
    )
    args = parser.parse_args()
    args.models.mkdir(parents=True, exist_ok=True)
    server, cpu_flags = args.runtime / "bin" / "llama-server", cpuinfo("flags")[0].split()
    rows: list[dict[str, Any]] = []
    files = encoder_files(args) if args.encoders else model_files(args)
    for name, path in files:
        gguf = read_gguf(path)
        cases = ENCODER_CASES if args.encoders else CASES if "-Q" not in name else CASES[:1]
        for cells, slots, ubatch in cases:
            logged = logged_buffers(server, path, cells, slots, ubatch, encoder=args.encoders)
            ours = compute_bytes(gguf, cells, ubatch, slots)
            rows.append({
                "model": name, "architecture": gguf.architecture,
                "hidden": gguf.embedding_length, "ffn": gguf.feed_forward_length,
                "heads": gguf.head_count, "key_length": gguf.key_length,
                "layers": gguf.block_count, "vocab": gguf.vocab_size,
                "cells": cells, "slots": slots, "ubatch": ubatch,
                "logged_mib": logged,
                "ours_mib": {
                    "compute": None if ours is None else round(ours / MIB, 2),
                    "repack": round(repacked_bytes(gguf, cpu_flags) / MIB, 2),
                    "output": round((gguf.vocab_size or 0) * slots * 4 / MIB, 2),
                },
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    machine = {
        "cpu": cpuinfo("model name")[0],
        "family_model": f"{cpuinfo('cpu family')[0]}/{cpuinfo('model')[0]}",
        "cpus": len(cpuinfo("processor")),
        "kernel": platform.release(),
    }
    args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
