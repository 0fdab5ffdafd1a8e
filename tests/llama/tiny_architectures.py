"""Tiny GGUF files of architectures the measured formulas do not cover, written with the gguf
package: each with the tensors the pinned llama.cpp's loader asks of that architecture (found
by asking it: its `missing tensor`, `wrong shape` and `key not found` errors), at a 128-wide,
2-layer size, the tiny qwen2's 2048-token tokenizer, weights of one value (only the memory is
asked of them, never a token)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
from llama_shape_model import copy_tokenizer

from tests.llama.realllama import tiny_gguf

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, HEAD = 128, 2, 4, 2, 256, 32
CONTEXT = 2048
Q, KV = HEADS * HEAD, KV_HEADS * HEAD
SHAPES: dict[str, tuple[int, ...]] = {
    # numpy order (rows, columns): llama.cpp's ne reversed; "vocab" is filled in
    "output_norm": (HIDDEN,), "attn_norm": (HIDDEN,), "ffn_norm": (HIDDEN,),
    "post_attention_norm": (HIDDEN,), "post_ffw_norm": (HIDDEN,),
    "attn_q": (Q, HIDDEN), "attn_k": (KV, HIDDEN), "attn_v": (KV, HIDDEN),
    "attn_output": (HIDDEN, Q), "attn_q_norm": (HEAD,), "attn_k_norm": (HEAD,),
    "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN),
}  # fmt: skip
ATTENTION = ("attn_q", "attn_k", "attn_v", "attn_output")
GATED_FFN = ("ffn_gate", "ffn_down", "ffn_up")
UNGATED_FFN = ("ffn_norm", "ffn_down", "ffn_up")
LLAMA_BLOCK = ("attn_norm", *ATTENTION, "ffn_norm", *GATED_FFN)
STARCODER2_BLOCK = ("attn_norm", *ATTENTION, *UNGATED_FFN, "attn_norm.bias", "attn_output.bias",
                    "ffn_norm.bias", "ffn_down.bias", "ffn_up.bias")  # fmt: skip
OLMO2_BLOCK = (*ATTENTION, "post_attention_norm", "attn_q_norm", "attn_k_norm", "post_ffw_norm",
               *GATED_FFN)  # fmt: skip
OWN = ("token_embd", "output_norm", "output")
TIED = ("token_embd", "output_norm")


@dataclass(frozen=True)
class Architecture:
    top: tuple[str, ...]
    block: tuple[str, ...]
    """Tensor kinds (`.weight`, unless named `.bias`) of the file and of each layer."""
    keys: dict[str, tuple[str, float | int]] = field(default_factory=dict)
    """Keys the loader requires beyond the common ones: name -> (GGUFWriter type, value)."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """This architecture's own shape of a kind."""


def weights(*kinds: str) -> tuple[str, ...]:
    return tuple(kind if kind.endswith(".bias") else f"{kind}.weight" for kind in kinds)


ARCHITECTURES: dict[str, Architecture] = {
    "gemma": Architecture(weights(*TIED), weights(*LLAMA_BLOCK)),
    "gemma2": Architecture(
        weights(*TIED), weights(*LLAMA_BLOCK, "post_attention_norm", "post_ffw_norm")
    ),
    "stablelm": Architecture(
        weights(*OWN, "output_norm.bias"),
        weights(*LLAMA_BLOCK, "attn_q_norm", "attn_k_norm", "attn_norm.bias"),
        shapes={"attn_q_norm": (HEADS, HEAD), "attn_k_norm": (KV_HEADS, HEAD)},
    ),
    "starcoder2": Architecture(weights(*OWN, "output_norm.bias"), weights(*STARCODER2_BLOCK)),
    "granite": Architecture(
        weights(*OWN), weights(*LLAMA_BLOCK), keys={"granite.logit_scale": ("float32", 1.0)}
    ),
    "olmo2": Architecture(
        weights(*OWN), weights(*OLMO2_BLOCK), shapes={"attn_q_norm": (Q,), "attn_k_norm": (KV,)}
    ),
    "internlm2": Architecture(weights(*OWN), weights(*LLAMA_BLOCK)),
    "smollm3": Architecture(weights(*OWN), weights(*LLAMA_BLOCK)),
    "exaone": Architecture(weights(*OWN), weights(*LLAMA_BLOCK)),
    "orion": Architecture(
        weights(*OWN, "output_norm.bias"),
        weights(*LLAMA_BLOCK, "attn_norm.bias", "ffn_norm.bias"),
    ),
    "mistral3": Architecture(weights(*OWN), weights(*LLAMA_BLOCK)),
    "ernie4_5": Architecture(weights(*OWN), weights(*LLAMA_BLOCK)),
    "seed_oss": Architecture(
        weights(*OWN), weights("attn_norm", *ATTENTION, "post_attention_norm", *GATED_FFN)
    ),
    "arcee": Architecture(weights(*OWN), weights("attn_norm", *ATTENTION, *UNGATED_FFN)),
    "hunyuan-dense": Architecture(
        weights(*OWN), weights(*LLAMA_BLOCK, "attn_q_norm", "attn_k_norm")
    ),
    "cohere2": Architecture(
        weights(*TIED),
        weights("attn_norm", *ATTENTION, *GATED_FFN),
        keys={
            "cohere2.attention.sliding_window": ("uint32", 512),
            "cohere2.logit_scale": ("float32", 1.0),
        },
    ),
}


def shape_of(architecture: Architecture, name: str, vocab: int) -> tuple[int, ...]:
    kind, part = name.rsplit(".", 1)
    if kind in ("token_embd", "output"):
        return (vocab, HIDDEN)
    shape = architecture.shapes.get(kind) or SHAPES[kind]
    return (shape[0],) if part == "bias" else shape


def write_tiny(name: str, out: Path) -> Path:
    """The tiny GGUF of architecture `name` (a key of ARCHITECTURES) at `out`."""
    architecture = ARCHITECTURES[name]
    writer = GGUFWriter(str(out), name)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD)
    writer.add_value_length(HEAD)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_layer_norm_eps(1e-5)
    writer.add_rope_freq_base(1e4)
    for key, (kind, value) in architecture.keys.items():
        getattr(writer, f"add_{kind}")(key, value)
    vocab = copy_tokenizer(GGUFReader(str(tiny_gguf("q8_0"))), writer)
    tensors = [(name, name) for name in architecture.top]
    tensors += [
        (f"blk.{layer}.{kind}", kind) for layer in range(LAYERS) for kind in architecture.block
    ]
    for name, kind in tensors:
        writer.add_tensor(name, np.full(shape_of(architecture, kind, vocab), 0.01, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
