"""llama.cpp's llama-server (docs/sources.md): its /health answers 503 "Loading model" while
it loads, its metrics (`--metrics`) are `llamacpp:` families with no KV cache use, and it
reads its API key from LLAMA_API_KEY (`--api-key-env`). No container image of it is pinned,
so it has no Kubernetes export yet."""

from __future__ import annotations

import sys
from pathlib import Path

from epycd.engines.base import Engine, ServerMetrics

LLAMA_CPP = Engine(
    name="llama.cpp",
    package=__name__,
    title="llama.cpp",
    server="llama-server",
    serves="a GGUF model; install.sh --engine llama.cpp builds it",
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
    commands=("convert",),
)

EMBEDDED_RUNTIME = Path(sys.prefix) / "llama-runtime"
"""Where `packaging/install.sh --engine llama.cpp` builds llama-server for this CPU
(packaging/llama-runtime.sh): `/opt/epyc-llm/llama-runtime/bin/llama-server`, which a
llama.cpp endpoint without a `llama_server` key serves with (`Settings.llama_runtime_dir`)."""
PACKAGED_RECIPE = Path("/usr/share/epyc-llm/llama-runtime.sh")
"""The runtime recipe as the Debian package installs it."""


def install_command(runtime_dir: Path, recipe: Path = PACKAGED_RECIPE) -> str:
    """The command that builds llama-server in runtime_dir on this install: the Debian
    package's recipe (its build prerequisites from apt first), else install.sh."""
    if recipe.is_file():
        return f"apt-get install g++ python3-venv && {recipe} {runtime_dir}"
    return "packaging/install.sh --engine llama.cpp"
