"""vLLM (docs/sources.md): its /health does not answer until the engine is ready, its metrics
are `vllm:` families (prometheus_client exposes a counter NAME as NAME_total, and each may
carry labels such as model_name, which are summed), and it reads its API key from
VLLM_API_KEY."""

from __future__ import annotations

from epycd.engines.base import Engine, ServerMetrics

VLLM = Engine(
    name="vllm",
    package=__name__,
    title="vLLM",
    server="vLLM",
    serves="a Hugging Face model",
    metrics=ServerMetrics(
        prefix="vllm:",
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        tokens=("vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
        kv_usage="vllm:kv_cache_usage_perc",
    ),
    api_key_env="VLLM_API_KEY",
    model_format="safetensors",
    cache_variables=(
        ("VLLM_CACHE_ROOT", "vllm"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("TRITON_CACHE_DIR", "triton"),
    ),
)
