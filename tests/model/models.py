"""Real models' small files, as published on the hub (config.json verbatim in the figures that
matter; chat templates abridged: only their presence and form matter here).

Weight sizes: `metadata.total_size` of the real `model.safetensors.index.json` where the real
model is sharded (Llama-3.1-8B-Instruct 16060522496, Llama-3.1-70B-Instruct 141107412992);
BAAI/bge-small-en-v1.5 ships one `model.safetensors`, rebuilt by `bge_small_safetensors` with
its real tensor names and shapes; the others have no weights in the cache (derived path).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content"
    " + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role']"
    " + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
GLM4_TEMPLATE = (
    "[gMASK]<sop>{% for item in messages %}{% if item['role'] == 'user' %}<|user|>\n"
    "{{ item['content'] }}{% elif item['role'] == 'assistant' %}<|assistant|>\n"
    "{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>"
    "{% endif %}"
)

QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

LLAMA_3_1_8B_INSTRUCT: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 128256,
}

LLAMA_3_1_70B_INSTRUCT: dict[str, Any] = {
    **LLAMA_3_1_8B_INSTRUCT,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
}

DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}

OLMO_2_0425_1B: dict[str, Any] = {
    "architectures": ["Olmo2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "eos_token_id": 100257,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "olmo2",
    "num_attention_heads": 16,
    "num_hidden_layers": 16,
    "num_key_value_heads": 16,
    "pad_token_id": 100277,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 500000,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.48.0.dev0",
    "use_cache": True,
    "vocab_size": 100352,
}

QWEN2_5_VL_7B_INSTRUCT: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "model_type": "qwen2_5_vl",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.41.2",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 152064,
}

BGE_SMALL_EN_V1_5: dict[str, Any] = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "classifier_dropout": None,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 384,
    "id2label": {"0": "LABEL_0"},
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "label2id": {"LABEL_0": 0},
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "torch_dtype": "float32",
    "transformers_version": "4.30.0",
    "type_vocab_size": 2,
    "use_cache": True,
    "vocab_size": 30522,
}

BGE_RERANKER_BASE: dict[str, Any] = {
    "architectures": ["XLMRobertaForSequenceClassification"],
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "id2label": {"0": "LABEL_0"},
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "label2id": {"LABEL_0": 0},
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 514,
    "model_type": "xlm-roberta",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 1,
    "position_embedding_type": "absolute",
    "torch_dtype": "float32",
    "type_vocab_size": 1,
    "use_cache": True,
    "vocab_size": 250002,
}
"""BAAI/bge-reranker-base: a cross-encoder, one label."""

TWITTER_ROBERTA_SENTIMENT: dict[str, Any] = {
    "architectures": ["RobertaForSequenceClassification"],
    "hidden_size": 768,
    "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
    "label2id": {"negative": 0, "neutral": 1, "positive": 2},
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
    "model_type": "roberta",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50265,
}
"""cardiffnlp/twitter-roberta-base-sentiment-latest: a classifier of three labels."""

GLM_4_9B_CHAT_HF: dict[str, Any] = {
    "architectures": ["GlmForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 13696,
    "max_position_embeddings": 131072,
    "model_type": "glm",
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "pad_token_id": 151329,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1.5625e-07,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.46.0.dev0",
    "use_cache": True,
    "vocab_size": 151552,
}

T5_SMALL: dict[str, Any] = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 2048,
    "d_kv": 64,
    "d_model": 512,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "t5",
    "n_positions": 512,
    "num_heads": 8,
    "num_layers": 6,
    "pad_token_id": 0,
    "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}

LLAMA_8B_TOTAL_SIZE = 16060522496
LLAMA_70B_TOTAL_SIZE = 141107412992


def _json(data: Any) -> bytes:
    return json.dumps(data, indent=2).encode()


def _index(total_size: int, shards: int, names: list[str]) -> bytes:
    weight_map = {
        name: f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors"
        for i, name in enumerate(names)
    }
    return _json({"metadata": {"total_size": total_size}, "weight_map": weight_map})


def _tokenizer_config(template: Any = None, **extra: Any) -> bytes:
    data: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **extra}
    if template is not None:
        data["chat_template"] = template
    return _json(data)


def bge_small_safetensors(folder: Path) -> Path:
    """BAAI/bge-small-en-v1.5's model.safetensors: real names and shapes, zero values."""
    import numpy as np
    from safetensors.numpy import save_file

    hidden, inter, layers = 384, 1536, 12
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (30522, hidden),
        "embeddings.position_embeddings.weight": (512, hidden),
        "embeddings.token_type_embeddings.weight": (2, hidden),
        "embeddings.LayerNorm.weight": (hidden,),
        "embeddings.LayerNorm.bias": (hidden,),
        "pooler.dense.weight": (hidden, hidden),
        "pooler.dense.bias": (hidden,),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            shapes[f"{p}attention.self.{part}.weight"] = (hidden, hidden)
            shapes[f"{p}attention.self.{part}.bias"] = (hidden,)
        shapes[f"{p}attention.output.dense.weight"] = (hidden, hidden)
        shapes[f"{p}attention.output.dense.bias"] = (hidden,)
        shapes[f"{p}attention.output.LayerNorm.weight"] = (hidden,)
        shapes[f"{p}attention.output.LayerNorm.bias"] = (hidden,)
        shapes[f"{p}intermediate.dense.weight"] = (inter, hidden)
        shapes[f"{p}intermediate.dense.bias"] = (inter,)
        shapes[f"{p}output.dense.weight"] = (hidden, inter)
        shapes[f"{p}output.dense.bias"] = (hidden,)
        shapes[f"{p}output.LayerNorm.weight"] = (hidden,)
        shapes[f"{p}output.LayerNorm.bias"] = (hidden,)
    path = folder / "bge-small-model.safetensors"
    save_file({k: np.zeros(v, dtype=np.float32) for k, v in shapes.items()}, str(path))
    return path


BGE_SMALL_PARAMETERS = 33_360_000
"""The model card's 33.4M parameters: the exact count of the real shapes above."""


def model_files(scratch: Path | None = None) -> dict[str, dict[str, bytes | Path]]:
    """repo id -> files of its cached snapshot (bge's weights only when `scratch` is given)."""
    llama_names = ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]
    return {
        "Qwen/Qwen3-0.6B": {
            "config.json": _json(QWEN3_0_6B),
            "tokenizer_config.json": _tokenizer_config(CHATML, model_max_length=131072),
        },
        "meta-llama/Llama-3.1-8B-Instruct": {
            "config.json": _json(LLAMA_3_1_8B_INSTRUCT),
            "tokenizer_config.json": _tokenizer_config(LLAMA3_TEMPLATE),
            "model.safetensors.index.json": _index(LLAMA_8B_TOTAL_SIZE, 4, llama_names),
        },
        "meta-llama/Llama-3.1-70B-Instruct": {
            "config.json": _json(LLAMA_3_1_70B_INSTRUCT),
            "tokenizer_config.json": _tokenizer_config(LLAMA3_TEMPLATE),
            "model.safetensors.index.json": _index(LLAMA_70B_TOTAL_SIZE, 30, llama_names),
        },
        "deepseek-ai/DeepSeek-V2-Lite": {
            "config.json": _json(DEEPSEEK_V2_LITE),
        },
        "allenai/OLMo-2-0425-1B": {
            "config.json": _json(OLMO_2_0425_1B),
            "tokenizer_config.json": _tokenizer_config(None, model_max_length=4096),
        },
        "Qwen/Qwen2.5-VL-7B-Instruct": {
            "config.json": _json(QWEN2_5_VL_7B_INSTRUCT),
            "tokenizer_config.json": _tokenizer_config(CHATML, model_max_length=131072),
        },
        "BAAI/bge-small-en-v1.5": {
            "config.json": _json(BGE_SMALL_EN_V1_5),
            "tokenizer_config.json": _tokenizer_config(None, model_max_length=512),
            "sentence_bert_config.json": _json({"max_seq_length": 512, "do_lower_case": True}),
            **({"model.safetensors": bge_small_safetensors(scratch)} if scratch else {}),
        },
        "BAAI/bge-reranker-base": {
            "config.json": _json(BGE_RERANKER_BASE),
            "tokenizer_config.json": _tokenizer_config(None, model_max_length=512),
        },
        "cardiffnlp/twitter-roberta-base-sentiment-latest": {
            "config.json": _json(TWITTER_ROBERTA_SENTIMENT),
        },
        "THUDM/glm-4-9b-chat-hf": {
            "config.json": _json(GLM_4_9B_CHAT_HF),
            "tokenizer_config.json": _tokenizer_config(GLM4_TEMPLATE),
        },
        "google-t5/t5-small": {
            "config.json": _json(T5_SMALL),
        },
    }
