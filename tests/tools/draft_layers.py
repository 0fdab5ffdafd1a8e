"""A draft model cut from a target: its first N decoder layers, its own embeddings, final norm
and (tied) head, the same tokenizer files. For speculative-decoding benchmarks of the seeded
random test models (tests/tools/tiny_model.py), where an independently drawn draft would
agree with the target on nothing.

Needs numpy and safetensors (the test .venv and the vLLM venv both have them); the tensors
are copied byte for byte (bf16 stays bf16).

    python tests/tools/draft_layers.py --model TARGET_DIR --layers N --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import safetensors

LAYER = re.compile(r"^model\.layers\.(\d+)\.")
COPIED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def cut(model: Path, layers: int, out: Path) -> None:
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    if not 0 < layers < config["num_hidden_layers"]:
        raise SystemExit(f"--layers must be 1..{config['num_hidden_layers'] - 1}")
    out.mkdir(parents=True, exist_ok=True)
    kept: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    header = _header(model / "model.safetensors")
    for name in header:
        match = LAYER.match(name)
        if match and int(match.group(1)) >= layers:
            continue
        kept[name] = _raw(model / "model.safetensors", header, name)
        dtypes[name] = header[name]["dtype"]
    specs = {
        name: safetensors.TensorSpec(
            dtype=_dtype_name(dtypes[name]),
            shape=list(header[name]["shape"]),
            data_ptr=array.ctypes.data,
            data_len=array.nbytes,
        )
        for name, array in kept.items()
    }
    safetensors.serialize_file(specs, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    config["max_window_layers"] = layers
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in COPIED:
        if (model / name).exists():
            shutil.copy2(model / name, out / name)


def _header(path: Path) -> dict[str, dict[str, Any]]:
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header: dict[str, dict[str, Any]] = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    base = 8 + size
    for entry in header.values():
        entry["base"] = base
    return header


def _raw(path: Path, header: dict[str, dict[str, Any]], name: str) -> np.ndarray:
    """The tensor's bytes as they are stored (bf16 has no numpy dtype)."""
    entry = header[name]
    start, end = entry["data_offsets"]
    with path.open("rb") as handle:
        handle.seek(entry["base"] + start)
        return np.frombuffer(handle.read(end - start), dtype=np.uint8).copy()


def _dtype_name(stored: str) -> str:
    return {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[stored]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the target model's folder")
    parser.add_argument("--layers", type=int, required=True, help="decoder layers to keep")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cut(args.model, args.layers, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
