"""The toy engine's endpoint-file keys: none of its own; the shared keys that only a real
server's flags or container give, refused with their fix."""

from __future__ import annotations

from epycd.spec.key_setting import EngineKeys

KEYS = EngineKeys(
    refused={
        key: f"remove {key}: the toy engine's stand-in server takes no {key}"
        for key in (
            "dtype",
            "vllm",
            "image",
            "chat_template",
            "extra_args",
            "env",
            "throughput_flags",
            "device",
        )
    }
)
