"""The tiny test model (tests/tools/tiny_model.py) as GGUF files, by llama.cpp's own converter.

Runs the pinned llama.cpp source's `convert_hf_to_gguf.py` (with its own gguf-py) under a
Python that has torch and transformers (the vLLM venv), on the tiny model's safetensors folder.
Its byte-level BPE tokenizer was trained here, so the converter's table of known pre-tokenizers
(a hash of each published tokenizer's output) cannot know it: it is declared "gpt-2", the
byte-level pre-tokenizer it was trained with. Writes NAME-bf16.gguf and NAME-q8_0.gguf.

    python tests/tools/tiny_gguf.py --source LLAMA_CPP_DIR --model DIR --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT_TYPES = ("bf16", "q8_0")


def convert(source: Path, model: Path, out: Path, out_type: str) -> None:
    sys.path[:0] = [str(source), str(source / "gguf-py")]
    # the pinned source's own modules, found through sys.path (no stubs: mypy skips them)
    from conversion import base  # type: ignore[import-not-found]

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    import convert_hf_to_gguf  # type: ignore[import-not-found]

    sys.argv = [
        "convert_hf_to_gguf.py", str(model), "--outtype", out_type, "--outfile", str(out),
    ]  # fmt: skip
    convert_hf_to_gguf.main()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the llama.cpp source folder")
    parser.add_argument("--model", type=Path, required=True, help="the tiny model's folder")
    parser.add_argument("--out", type=Path, required=True, help="where the .gguf files go")
    parser.add_argument("--type", choices=OUT_TYPES, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    convert(args.source, args.model, args.out / f"tiny-{args.type}.gguf", args.type)
    return 0


if __name__ == "__main__":
    sys.exit(main())
