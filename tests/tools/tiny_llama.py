"""A tiny Llama chat model whose tokenizer is SentencePiece (a `tokenizer.model`, as Llama 2,
Mistral and TinyLlama ship), for the conversion tests: llama.cpp's converter reads a
SentencePiece vocabulary as it is, where a byte-level BPE tokenizer trained here is refused
(its table of pre-tokenizers knows only published ones by a hash of their output).

Hidden 64, 2 layers, 4 heads (2 KV heads), intermediate 128, 512 positions, seeded random
bf16 weights; a unigram SentencePiece model of 1,000 pieces trained on a fixed set of this
interpreter's stdlib sources; a chat template of the ChatML form. Built offline and
deterministically under the vLLM venv's Python (torch, transformers, sentencepiece).
`--size small` builds the same recipe at ~100M parameters (hidden 768, 16 layers, 12 heads, 4
KV heads, intermediate 2048, 2048 positions) for benchmarks/auto_engine.py, where matrix work
has to show and the product converts the model itself.

    python tests/tools/tiny_llama.py --out DIR [--size small]
"""

from __future__ import annotations

import argparse
import io
import sys
import sysconfig
from pathlib import Path

SEED = 20261206
VOCAB = 1000
CORPUS_MODULES = ["textwrap.py", "argparse.py", "string.py", "this.py", "json/decoder.py"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(out: Path) -> Path:
    import sentencepiece  # type: ignore[import-not-found]

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines = [
        line
        for name in CORPUS_MODULES
        for line in (stdlib / name).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=VOCAB,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        num_threads=1,
        minloglevel=2,
    )
    path = out / "tokenizer.model"
    path.write_bytes(model.getvalue())
    return path


SIZES = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512},
    "small": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 16,
              "num_attention_heads": 12, "num_key_value_heads": 4,
              "max_position_embeddings": 2048},
}  # fmt: skip


def build(out: Path, size: str = "tiny") -> None:
    # the vLLM venv's, never the test .venv's (no stubs: mypy skips them)
    import torch  # type: ignore[import-not-found]
    from transformers import (  # type: ignore[import-not-found]
        LlamaConfig,
        LlamaForCausalLM,
        LlamaTokenizer,
    )

    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out)
    # from the folder, not LlamaTokenizer(vocab_file=...): transformers 5 then converts the
    # SentencePiece model into its tokenizers backend (the constructor keeps 3 special tokens
    # only, and the saved tokenizer.json would hold no more)
    words = LlamaTokenizer.from_pretrained(out, legacy=False, add_bos_token=True)
    words.chat_template = CHAT_TEMPLATE
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB,
        **SIZES[size],
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    words.save_pretrained(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args()
    build(args.out, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
