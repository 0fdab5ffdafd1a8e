"""llama.cpp's own settings (`LlamaSettings`): where its runtime is. `epycd.settings` adds
them to `Settings` (`settings_model`), so they come from an `EPYCD_` variable or epycd.conf
as every setting does."""

from __future__ import annotations

from pydantic import BaseModel

from epycd.engines.llama_cpp import EMBEDDED_RUNTIME
from epycd.settings import AbsolutePath


class LlamaSettings(BaseModel):
    llama_runtime_dir: AbsolutePath = EMBEDDED_RUNTIME
    """The llama.cpp runtime: llama.cpp endpoints serve with its bin/llama-server unless the
    endpoint file names another (`llama_server`)."""

    @classmethod
    def of(cls, settings: BaseModel) -> LlamaSettings:
        """Its settings in loaded settings (their defaults in settings made without them, as a
        test makes them)."""
        return settings if isinstance(settings, LlamaSettings) else cls()


SETTINGS = LlamaSettings
