"""GGUF, llama.cpp's own model format (`epycd.model.formats.ModelFormat`): a model that names a
.gguf file, or gives the endpoint file's `gguf_file`, is read here from the file's own metadata
(`gguf.py`); llama.cpp serves it where its pinned source knows the architecture
(`tables.py`)."""

from __future__ import annotations

from epycd.engines.llama_cpp.model import tables
from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import kv_bytes_per_token
from epycd.model.facts import ChatTemplate, EngineSupport, GgufFile, ModelFacts, Support
from epycd.model.formats import ModelFormat
from epycd.model.hub import is_gguf, locate_gguf
from epycd.model.template import endpoints, template_from_override

ENGINE = "llama.cpp"


class GgufFormat(ModelFormat):
    engine = ENGINE
    name = "gguf"
    vllm_refusal = (
        "its CPU backend loads no GGUF weights (GGUF is GPU-only in vLLM's quantization table)"
    )

    def holds(self, model: str, file: str | None) -> bool:
        return is_gguf(model, file)

    def inspect(
        self,
        model: str,
        *,
        file: str | None,
        revision: str | None,
        chat_template_override: str | None,
        others: list[EngineSupport],
        support: Support,
    ) -> ModelFacts:
        """A GGUF file's facts: llama.cpp serves it where its pinned source knows the
        architecture."""
        source = locate_gguf(model, file, revision=revision)
        gguf = read_gguf(source.path, name=source.name)
        notes = list(source.warnings)
        known = architecture_support(gguf.architecture)
        template = (
            template_from_override(chat_template_override)
            if chat_template_override
            else ChatTemplate(
                status="present" if gguf.chat_template else "absent",
                source="the GGUF file (tokenizer.chat_template)" if gguf.chat_template else None,
            )
        )
        primary, supported_endpoints, launchable = endpoints(known.kind, template)
        kv_per_token = kv_bytes_per_token(gguf)
        if kv_per_token is None:
            notes.append(
                "the GGUF file lacks the attention figures: KV bytes per token unknown (0)"
            )
        own = EngineSupport(
            engine=ENGINE,
            version=known.version,
            supported=known.supported and launchable,
            kind=known.kind,
            reason=verdict(gguf, known, template, launchable),
        )
        return ModelFacts(
            model=model,
            format="gguf",
            gguf=gguf,
            engines=[*others, own],
            revision=source.revision,
            local_path=str(source.path),
            architectures=[gguf.architecture],
            model_type=gguf.architecture,
            torch_dtype=gguf.file_type,
            support=support,
            chat_template=template,
            primary_endpoint=primary if known.supported else None,
            supported_endpoints=supported_endpoints if known.supported else [],
            launchable=bool(known.supported and launchable),
            gated=None,
            weights_bytes=gguf.tensors_bytes,
            weights_source="gguf-tensors",
            kv_bytes_per_token=kv_per_token or 0,
            max_position_embeddings=gguf.context_length,
            message=own.reason,
            warnings=notes,
        )

    def elsewhere(self) -> EngineSupport:
        return EngineSupport(
            engine=ENGINE,
            version=tables.pinned_version(),
            supported=False,
            kind="unsupported",
            reason="llama.cpp serves GGUF files: choose a GGUF file of this model "
            "(gguf_file), or convert it with llama.cpp's convert_hf_to_gguf.py",
        )


FORMAT = GgufFormat()


def architecture_support(architecture: str) -> EngineSupport:
    """llama.cpp's answer for a GGUF architecture, from its pinned source's table."""
    version = tables.pinned_version()
    known = architecture in tables.load_table(version).architectures
    not_text = tables.NOT_TEXT_GENERATION.get(architecture)
    if not known:
        reason = f"llama.cpp {version} does not know the architecture {architecture!r}"
        return EngineSupport(
            engine=ENGINE, version=version, supported=False, kind="unsupported", reason=reason
        )
    if not_text:
        return EngineSupport(
            engine=ENGINE,
            version=version,
            supported=False,
            kind="pooling",
            reason=f"{architecture} is {not_text}: no chat or completions endpoint",
        )
    return EngineSupport(
        engine=ENGINE, version=version, supported=True, kind="text", reason="known"
    )


def verdict(gguf: GgufFile, known: EngineSupport, template: ChatTemplate, launchable: bool) -> str:
    """One sentence for a person, as `epycd.model.check.verdict` says it for vLLM."""
    quant = f"{gguf.file_type} " if gguf.file_type else ""
    if not known.supported:
        return f"not servable: {known.reason}"
    lead = f"servable by llama.cpp {known.version}: {quant}{gguf.architecture} GGUF"
    if template.status == "present":
        return f"{lead}; /v1/chat/completions (template from {template.source})"
    return (
        f"{lead}; /v1/completions only, the file has no chat template: give "
        "chat_template = <file> in the endpoint file to enable chat"
    )
