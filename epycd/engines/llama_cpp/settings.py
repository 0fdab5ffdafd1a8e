"""llama.cpp's own settings (`LlamaSettings`): where its runtime is. `epycd.settings` adds
them to `Settings` (`settings_model`), so they come from an `EPYCD_` variable or epycd.conf
as every setting does."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from epycd.engines.llama_cpp import EMBEDDED_RUNTIME
from epycd.settings import AbsolutePath


class LlamaSettings(BaseModel):
    llama_runtime_dir: AbsolutePath = EMBEDDED_RUNTIME
    """The llama.cpp runtime: llama.cpp endpoints serve with its bin/llama-server unless the
    endpoint file names another (`llama_server`)."""

    llama_converted_dir: AbsolutePath = Path("/var/cache/epyc-llm-converted")
    """Where approve writes the GGUF files of the safetensors models llama.cpp endpoints
    serve (docs/conversion.md), one per model, revision and weights."""

    @classmethod
    def of(cls, settings: BaseModel) -> LlamaSettings:
        """Its settings in loaded settings (their defaults in settings made without them, as a
        test makes them)."""
        return settings if isinstance(settings, LlamaSettings) else cls()


SETTINGS = LlamaSettings
