"""llama.cpp's llama-server (docs/sources.md): its /health answers 503 "Loading model" while
it loads, its metrics (`--metrics`) are `llamacpp:` families with no KV cache use, and it
reads its API key from LLAMA_API_KEY (`--api-key-env`). No container image of it is pinned,
so it has no Kubernetes export yet."""

from __future__ import annotations

from epycd.engines.base import Engine, ServerMetrics

LLAMA_CPP = Engine(
    name="llama.cpp",
    package=__name__,
    title="llama.cpp",
    server="llama-server",
    metrics=ServerMetrics(
        prefix="llamacpp:",
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        tokens=("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"),
    ),
    api_key_env="LLAMA_API_KEY",
    runtimes=("host",),
    runtimes_reason="runs llama-server on the host (no image is pinned yet)",
    loading_health={"message": "Loading model", "type": "unavailable_error", "code": 503},
    model_format="gguf",
    no_kube_export="no llama-server image is pinned",
)
