"""A tiny Qwen2ForCausalLM for the real-vLLM tests, built offline and deterministically.

hidden 128, 2 layers, 4 heads, 2 KV heads (head_dim 32, a head size vLLM's CPU attention
supports), vocab 2048, seeded random bf16 weights in safetensors, a byte-level BPE tokenizer
trained on a fixed set of this interpreter's stdlib sources, and a ChatML chat template.
`--size small` builds the same recipe at ~100M parameters (hidden 768, 16 layers, 12 heads,
4 KV heads, head_dim 64) for benchmarks/serving.py, where matrix work has to show.

Needs numpy, safetensors and tokenizers (the test .venv and the vLLM venv both have them).
bf16 is not a numpy dtype: the weights are rounded to bf16 bit patterns in uint16 arrays and
handed to safetensors' own serializer with dtype "bfloat16".

    python tests/tools/tiny_model.py --cache DIR     # build once into DIR (a no-op when built)
    python tests/tools/tiny_model.py --out DIR [--no-chat-template] [--broken-weights]
    python tests/tools/tiny_model.py --cache DIR --size small
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

RECIPE = "tiny-qwen2-v1"
STAMP = ".tiny-model-stamp"
VOCAB = 2048
MAX_POSITIONS = 2048
SEED = 20261130


@dataclass(frozen=True)
class Shape:
    """The transformer's sizes; the vocabulary is the trained tokenizer's, the same for all."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        return sum(_count(shape) for shape in tensor_shapes(self).values())


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


SHAPES = {
    "tiny": Shape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256),
    "small": Shape(hidden=768, layers=16, heads=12, kv_heads=4, intermediate=2048),
}
TINY = SHAPES["tiny"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS_MODULES = [
    "textwrap.py",
    "argparse.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "shutil.py",
    "string.py",
    "this.py",
]


def corpus() -> list[str]:
    """Stdlib sources that exist on every CPython 3.11+: local text, no download."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_MODULES]


def train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer


def tensor_shapes(size: Shape = TINY) -> dict[str, tuple[int, ...]]:
    hidden, intermediate = size.hidden, size.intermediate
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, hidden),
        "model.norm.weight": (hidden,),
    }
    q_out, kv_out = size.heads * size.head_dim, size.kv_heads * size.head_dim
    for layer in range(size.layers):
        p = f"model.layers.{layer}"
        shapes |= {
            f"{p}.input_layernorm.weight": (hidden,),
            f"{p}.post_attention_layernorm.weight": (hidden,),
            f"{p}.self_attn.q_proj.weight": (q_out, hidden),
            f"{p}.self_attn.q_proj.bias": (q_out,),
            f"{p}.self_attn.k_proj.weight": (kv_out, hidden),
            f"{p}.self_attn.k_proj.bias": (kv_out,),
            f"{p}.self_attn.v_proj.weight": (kv_out, hidden),
            f"{p}.self_attn.v_proj.bias": (kv_out,),
            f"{p}.self_attn.o_proj.weight": (hidden, q_out),
            f"{p}.mlp.gate_proj.weight": (intermediate, hidden),
            f"{p}.mlp.up_proj.weight": (intermediate, hidden),
            f"{p}.mlp.down_proj.weight": (hidden, intermediate),
        }
    return shapes


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (round to nearest even), as uint16."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def random_weights(size: Shape = TINY) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    weights = {}
    for name, shape in tensor_shapes(size).items():
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            values = rng.normal(0.0, 0.02, size=shape).astype(np.float32)
        weights[name] = to_bf16_bits(values)
    return weights


def write_safetensors(path: Path, weights: dict[str, np.ndarray], *, broken: bool) -> None:
    """With `broken`, the embedding's header shape disagrees with the model: loading fails."""
    specs = {}
    for name, array in weights.items():
        shape = list(array.shape)
        if broken and name == "model.embed_tokens.weight":
            shape = [shape[0] * 2, shape[1] // 2]
        specs[name] = safetensors.TensorSpec(
            dtype="bfloat16", shape=shape, data_ptr=array.ctypes.data, data_len=array.nbytes
        )
    safetensors.serialize_file(specs, str(path), metadata={"format": "pt"})
    path.chmod(0o644)


def config(size: Shape = TINY) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": size.hidden,
        "intermediate_size": size.intermediate,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.kv_heads,
        "head_dim": size.head_dim,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": size.layers,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 2,
        "use_cache": True,
    }


def tokenizer_config(*, chat_template: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {
                "content": token,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
                "special": True,
            }
            for i, token in enumerate(SPECIAL_TOKENS)
        },
    }
    if chat_template:
        data["chat_template"] = CHATML_TEMPLATE
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(
    out: Path, *, chat_template: bool = True, broken_weights: bool = False, size: Shape = TINY
) -> Path:
    """Write the model into `out` (created; existing files are overwritten)."""
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", random_weights(size), broken=broken_weights)
    write_json(out / "config.json", config(size))
    write_json(out / "generation_config.json", {"eos_token_id": 2, "do_sample": False})
    train_tokenizer().save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(chat_template=chat_template))
    write_json(
        out / "special_tokens_map.json",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    return out


def recipe_stamp(size: Shape = TINY) -> str:
    source = Path(__file__).read_bytes() + json.dumps(asdict(size)).encode()
    return f"{RECIPE} {hashlib.sha256(source).hexdigest()[:16]} py{sys.version_info[:2]}"


def cached(cache: Path, size: Shape = TINY) -> Path:
    """The default variant, built once into `cache` (rebuilt when this recipe changes)."""
    stamp = cache / STAMP
    if stamp.is_file() and stamp.read_text(encoding="utf-8") == recipe_stamp(size):
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-model-", dir=cache.parent))
    build(staging, size=size)
    (staging / STAMP).write_text(recipe_stamp(size), encoding="utf-8")
    shutil.rmtree(cache, ignore_errors=True)
    staging.rename(cache)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--cache", type=Path, help="build the default variant once, here")
    target.add_argument("--out", type=Path, help="build into this folder")
    parser.add_argument("--no-chat-template", action="store_true")
    parser.add_argument("--broken-weights", action="store_true")
    parser.add_argument("--size", choices=sorted(SHAPES), default="tiny")
    args = parser.parse_args()
    size = SHAPES[args.size]
    if args.cache:
        print(f"{args.size} model: {cached(args.cache, size)}")
    else:
        built = build(
            args.out,
            chat_template=not args.no_chat_template,
            broken_weights=args.broken_weights,
            size=size,
        )
        print(f"{args.size} model: {built}")


if __name__ == "__main__":
    main()
