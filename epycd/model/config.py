"""Figures read from a model's `config.json` (docs/sources.md, "Model figures from
config.json"). Pure functions.

Multimodal and wrapper configs keep the language model in `text_config`, `language_config` or
`llm_config`; its keys win over the top level's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Config = Mapping[str, Any]

NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config")
KV_CACHE_DTYPE_BYTES = 2
"""bf16: the only KV cache dtype on zentorch, and the product's default dtype."""

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


def text_config(config: Config) -> dict[str, Any]:
    """The language model's config: the top level overlaid with the first nested text config."""
    merged = {k: v for k, v in config.items() if k not in NESTED_TEXT_KEYS}
    for key in NESTED_TEXT_KEYS:
        nested = config.get(key)
        if isinstance(nested, Mapping):
            merged.update(nested)
            break
    return merged


def _first_int(config: Config, *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def num_layers(config: Config) -> int | None:
    return _first_int(text_config(config), "num_hidden_layers", "n_layer", "num_layers")


def attention_heads(config: Config) -> int | None:
    return _first_int(text_config(config), "num_attention_heads", "n_head", "num_heads")


def kv_heads(config: Config) -> int | None:
    text = text_config(config)
    return _first_int(
        text, "num_key_value_heads", "multi_query_group_num", "n_head_kv", "num_kv_heads"
    ) or attention_heads(config)


def hidden_size(config: Config) -> int | None:
    return _first_int(text_config(config), "hidden_size", "n_embd", "d_model")


def head_dim(config: Config) -> int | None:
    explicit = _first_int(text_config(config), "head_dim", "kv_channels")
    if explicit:
        return explicit
    hidden, heads = hidden_size(config), attention_heads(config)
    return hidden // heads if hidden and heads else None


def is_mla(config: Config) -> bool:
    return _first_int(text_config(config), "kv_lora_rank") is not None


def kv_bytes_per_token(config: Config, *, dtype_bytes: int = KV_CACHE_DTYPE_BYTES) -> int | None:
    """KV cache bytes one token takes in all layers; None when the config lacks the figures.

    MHA/GQA: K and V, `layers x kv_heads x head_dim` each. MLA (`kv_lora_rank` present): one
    latent of `kv_lora_rank + qk_rope_head_dim` per layer, not doubled (vLLM caches the
    compressed latent once).
    """
    layers = num_layers(config)
    if layers is None:
        return None
    text = text_config(config)
    if is_mla(config):
        latent = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
        return layers * latent * dtype_bytes
    heads, dim = kv_heads(config), head_dim(config)
    if heads is None or dim is None:
        return None
    return 2 * layers * heads * dim * dtype_bytes


def max_positions(config: Config) -> int | None:
    return _first_int(
        text_config(config),
        "max_position_embeddings",
        "max_sequence_length",
        "seq_length",
        "n_positions",
        "max_seq_len",
    )


def checkpoint_dtype(config: Config) -> str | None:
    for source in (config, text_config(config)):
        value = source.get("torch_dtype") or source.get("dtype")
        if isinstance(value, str):
            return value
    return None


def derived_weights_bytes(config: Config) -> int | None:
    """Weights estimated from the config when no safetensors metadata is at hand.

    Counts the matrices of a decoder-only transformer: embeddings (and an untied LM head),
    per layer the attention projections (MLA: the low-rank q/kv projections) and the MLP
    (3 matrices for gated SiLU MLPs, 2 otherwise; MoE: routed + shared experts and the router,
    dense for the first `first_k_dense_replace` layers), times the checkpoint dtype's bytes
    (bf16 when unknown). Norms and biases are left out (well under 1 %); a vision tower is not
    counted, so multimodal models come out low.
    """
    layers, hidden = num_layers(config), hidden_size(config)
    heads, kv, dim = attention_heads(config), kv_heads(config), head_dim(config)
    text = text_config(config)
    vocab = _first_int(text, "vocab_size", "padded_vocab_size")
    if not (layers and hidden and heads and kv and dim and vocab):
        return None
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings", True) else 2)
    attention = _attention_params(text, hidden, heads, kv, dim)
    dense_mlp, moe_mlp = _mlp_params(text, hidden)
    dense_layers = min(layers, _first_int(text, "first_k_dense_replace") or 0)
    if moe_mlp is None:
        mlp_total = layers * dense_mlp
    else:
        mlp_total = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    params = embeddings + layers * attention + mlp_total
    return params * DTYPE_BYTES.get(checkpoint_dtype(config) or "bfloat16", 2)


def _attention_params(text: Config, hidden: int, heads: int, kv: int, dim: int) -> int:
    kv_rank = _first_int(text, "kv_lora_rank")
    if kv_rank is None:
        return hidden * (heads + 2 * kv) * dim + heads * dim * hidden
    rope = _first_int(text, "qk_rope_head_dim") or 0
    nope = _first_int(text, "qk_nope_head_dim") or dim
    v_dim = _first_int(text, "v_head_dim") or dim
    q_rank = _first_int(text, "q_lora_rank")
    q_head = nope + rope
    q = hidden * q_rank + q_rank * heads * q_head if q_rank else hidden * heads * q_head
    kv_proj = hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim)
    return q + kv_proj + heads * v_dim * hidden


def _mlp_params(text: Config, hidden: int) -> tuple[int, int | None]:
    """(dense MLP params per layer, MoE MLP params per layer or None for a dense model)."""
    gated = str(text.get("hidden_act", "silu")).lower() in {"silu", "swish", "swiglu"}
    matrices = 3 if gated else 2
    intermediate = _first_int(text, "intermediate_size", "ffn_hidden_size", "n_inner") or (
        4 * hidden
    )
    dense = matrices * hidden * intermediate
    experts = _first_int(text, "n_routed_experts", "num_experts", "num_local_experts")
    if not experts:
        return dense, None
    expert_size = _first_int(text, "moe_intermediate_size") or intermediate
    shared_size = (_first_int(text, "n_shared_experts") or 0) * expert_size + (
        _first_int(text, "shared_expert_intermediate_size") or 0
    )
    moe = matrices * hidden * (experts * expert_size + shared_size) + hidden * experts
    return dense, moe


def labels(config: Config) -> int:
    """A classification head's labels: `id2label`'s, else `num_labels`, else Transformers'
    default of 2."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    count = config.get("num_labels")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 2
