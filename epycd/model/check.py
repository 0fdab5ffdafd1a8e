"""Model facts for one model: what the engine of its format makes of it, and every other
engine's answer.

The one entry point of the model stage (`inspect_model`); the CLI and the planner call it.
Each format's engine reads the model (`epycd.model.formats`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epycd.model.facts import ModelFacts
from epycd.model.formats import InspectRequest, format_of, model_formats

if TYPE_CHECKING:
    from epycd.host.probe_cache import ProbeCache


def inspect_model(
    model: str,
    *,
    revision: str | None = None,
    vllm_version: str | None = None,
    token: str | None = None,
    chat_template_override: str | None = None,
    vllm_executable: str | None = None,
    probe_cache: ProbeCache | None = None,
    gguf_file: str | None = None,
) -> ModelFacts:
    """`gguf_file`: the GGUF file of a hub repository or folder; `vllm_version` and
    `vllm_executable`: the vLLM to judge a Hugging Face model by (`InspectRequest`)."""
    request = InspectRequest(
        model=model,
        file=gguf_file,
        revision=revision,
        token=token,
        chat_template_override=chat_template_override,
        engine_version=vllm_version,
        engine_executable=vllm_executable,
        probe_cache=probe_cache,
    )
    holder = format_of(request)
    others = [f.elsewhere(holder, request) for f in model_formats() if f is not holder]
    return holder.inspect(request, others)
