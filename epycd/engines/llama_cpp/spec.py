"""llama.cpp's endpoint-file keys (`EngineKeys`): its own, `gguf_file` and `llama_server`,
and the fix for each of vLLM's keys a llama.cpp endpoint file sets."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from epycd.spec.key_setting import AUTO_ENGINE, CPU_ONLY, EngineKeys, KeySetting, PathText

ENGINE = ("llama.cpp",)
CONVERTING = ("llama.cpp", AUTO_ENGINE)
"""The engines whose endpoint may serve a safetensors model converted to GGUF."""


class LlamaKeys(BaseModel):
    """llama.cpp's own keys' types and defaults (`EngineKeys.fields`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    llama_server: PathText | None = None
    quantize: Literal["q8_0", "q4_k_m", "bf16"] | None = None
    """The weights of a safetensors model llama.cpp serves once approve converted it
    (docs/conversion.md): q8_0 when not given."""
    speculative: Literal["ngram"] | None = None
    """Speculative decoding by n-gram lookup in the request's own context (llama-server's
    `--spec-type ngram-mod`); off when not given: no profile turns it on
    (docs/tuning.md rule 13)."""

    @classmethod
    def of(cls, spec: BaseModel) -> LlamaKeys:
        """Its keys in a validated endpoint file (their defaults in a spec made without
        them, as a test makes one)."""
        return spec if isinstance(spec, LlamaKeys) else cls()


KEYS = EngineKeys(
    own=(
        KeySetting(
            "gguf_file",
            "the GGUF file's name in the hub repository or folder `model` names, e.g. "
            "'model-Q4_K_M.gguf' (a relative name: no '..', not an absolute path)",
            "llama.cpp: the GGUF file in the repository or folder",
            engines=CONVERTING,
            devices=CPU_ONLY,
        ),
        KeySetting(
            "llama_server",
            "an absolute path to a llama-server executable (default: the one install.sh "
            "--engine llama.cpp built)",
            "llama.cpp: a llama-server of your own",
            engines=ENGINE,
            devices=CPU_ONLY,
        ),
        KeySetting(
            "quantize",
            "'q8_0' (the default: near-lossless), 'q4_k_m' (a quarter of bf16's size, as "
            "Ollama serves) or 'bf16'",
            "llama.cpp: the weights a safetensors model is converted to at approve "
            "([docs/conversion.md](conversion.md))",
            engines=CONVERTING,
            devices=CPU_ONLY,
            fixes={"vllm": "remove quantize: vLLM serves the safetensors weights as they are"},
        ),
        KeySetting(
            "speculative",
            "'ngram': draft tokens by n-gram lookup in the request's own context (no draft "
            "model); off when not given",
            "llama.cpp: speculative decoding for output that repeats its input (code edits, "
            "extraction); opt-in, [docs/tuning.md](tuning.md) rule 13",
            engines=ENGINE,
            devices=CPU_ONLY,
        ),
    ),
    refused={
        "dtype": "remove dtype: a GGUF file carries its own weight types",
        "vllm": "remove vllm: set llama_server = PATH for a llama-server of your own",
        "image": "remove image: llama.cpp endpoints run the host's llama-server",
        "extra_args": "remove extra_args: the plan decides llama-server's flags "
        "(docs/tuning.md rule 10)",
        "env": "remove env: the plan owns llama-server's environment",
        "throughput_flags": "remove throughput_flags: zentorch's throughput set is for vLLM",
        "device": "remove device: llama.cpp endpoints serve on the CPU",
    },
    fields=LlamaKeys,
)
