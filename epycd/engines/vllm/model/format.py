"""Hugging Face models, vLLM's format (`epycd.model.formats.ModelFormat`, the catch-all): a
folder or hub repository of config.json and safetensors weights, read as vLLM reads it. What
vLLM makes of its architectures is `support.py`'s (the `data/vllm/` tables, or an installed
vLLM's own registry); its template, endpoints, weights and KV figures are read here with the
core's readers (`epycd.model.hub`, `template`, `weights`, `config`)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from epycd import engines
from epycd.engines.vllm.model.support import support_from_installed, support_from_table
from epycd.errors import InputError
from epycd.model import config as cfg
from epycd.model.facts import (
    POOLING_ENDPOINTS,
    ChatTemplate,
    EngineSupport,
    ModelFacts,
    Support,
)
from epycd.model.formats import InspectRequest, ModelFormat, in_registry_order
from epycd.model.hub import ModelSource, locate_model
from epycd.model.tables import data_dir
from epycd.model.template import endpoints, template_from_override, template_status
from epycd.model.weights import local_weights_bytes
from epycd.readfile import MODEL_JSON_MAX_BYTES, TABLE_MAX_BYTES, read_text

if TYPE_CHECKING:
    from epycd.host.probe_cache import ProbeCache

ENGINE = "vllm"
FALLBACK_VLLM_VERSION = "0.25.1"
WeightsSource = Literal["safetensors-header", "safetensors-index", "hub-metadata", "derived"]

REFUSALS = {
    "gguf": "its CPU backend loads no GGUF weights (GGUF is GPU-only in vLLM's quantization table)",
}
"""Why vLLM cannot load a model of another engine's format, by the format's name."""


def pinned_vllm_version() -> str:
    """`vllm_version` of data/epyc.json, else the validated default."""
    stack = data_dir() / "epyc.json"
    try:
        version = json.loads(read_text(stack, TABLE_MAX_BYTES)).get("vllm_version")
    except (OSError, ValueError, AttributeError):
        return FALLBACK_VLLM_VERSION
    return str(version) if version else FALLBACK_VLLM_VERSION


class HuggingFaceFormat(ModelFormat):
    engine = ENGINE
    name = "safetensors"
    catch_all = True

    def holds(self, request: InspectRequest) -> bool:
        return True

    def inspect(self, request: InspectRequest, others: list[EngineSupport]) -> ModelFacts:
        """A Hugging Face model's facts: vLLM's answer for its architectures, its template
        and endpoints, weights and KV figures."""
        source = locate_model(request.model, revision=request.revision, token=request.token)
        config = read_config(source.folder)
        architectures = [str(a) for a in config.get("architectures") or []]
        notes = list(source.warnings)

        support = _support(
            architectures,
            cfg.labels(config),
            request.engine_version,
            request.engine_executable,
            notes,
            request.probe_cache,
        )
        if support.kind == "text" and has_pooling_module(source.folder):
            support = support.model_copy(update={"kind": "embedding"})
            notes.append(
                f"{', '.join(architectures)} generates text, but its sentence-transformers "
                "modules.json pools its output: an embedder, as vLLM serves it (a pooling "
                "config resolves --runner to pooling and converts the model to embed)"
            )
        template = _chat_template(request.chat_template_override, source.folder)
        primary, supported_endpoints, launchable = endpoints(support.kind, template)
        weights_bytes, weights_source = _weights(source, config, notes)
        kv_per_token = cfg.kv_bytes_per_token(config)
        if kv_per_token is None:
            notes.append("config.json lacks the layer/head figures: KV bytes per token unknown (0)")

        message = verdict(architectures, support, template, launchable)
        return ModelFacts(
            model=request.model,
            engines=in_registry_order(
                [
                    _vllm_engine(support, message, launchable),
                    *(other.model_copy(update={"kind": support.kind}) for other in others),
                ]
            ),
            revision=source.revision,
            local_path=str(source.folder),
            architectures=architectures,
            model_type=_text(config.get("model_type")),
            torch_dtype=cfg.checkpoint_dtype(config),
            support=support,
            chat_template=template,
            primary_endpoint=primary,
            supported_endpoints=supported_endpoints,
            launchable=launchable,
            gated=source.gated,
            weights_bytes=weights_bytes,
            weights_source=weights_source,
            kv_bytes_per_token=kv_per_token or 0,
            max_position_embeddings=cfg.max_positions(config),
            max_input_tokens=(
                input_limit(source.folder, cfg.max_positions(config))
                if primary in POOLING_ENDPOINTS
                else None
            ),
            embedding_width=(
                embedding_width(source.folder, config) if primary == "embeddings" else None
            ),
            is_mla=cfg.is_mla(config),
            message=message,
            warnings=[*notes, *support.warnings],
        )

    def elsewhere(self, holder: ModelFormat, request: InspectRequest) -> EngineSupport:
        version = request.engine_version or pinned_vllm_version()
        why = REFUSALS.get(holder.name, f"it reads Hugging Face models, not {holder.name} files")
        title = engines.engine_named(holder.engine).title
        return EngineSupport(
            engine=ENGINE,
            version=version,
            supported=False,
            kind="unsupported",
            reason=f"vLLM {version} cannot serve it: {why}; serve it with {title}",
        )


FORMAT = HuggingFaceFormat()


def _vllm_engine(support: Support, message: str, launchable: bool) -> EngineSupport:
    supported = support.supported if launchable or support.supported is None else False
    return EngineSupport(
        engine="vllm",
        version=support.vllm_version,
        supported=supported,
        kind=support.kind,
        reason=message,
    )


def _chat_template(override: str | None, folder: Path) -> ChatTemplate:
    """The endpoint file's chat_template when given, else the model folder's own."""
    return template_from_override(override) if override else template_status(folder)


SENTENCE_TRANSFORMERS_CONFIGS = tuple(
    f"sentence_{name}_config.json"
    for name in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)
"""The sentence-transformers tokenize configs vLLM reads, in its order
(vllm/transformers_utils/config.py of vLLM 0.32.0)."""


def input_limit(folder: Path, positions: int | None) -> int | None:
    """The max_model_len vLLM derives for a pooling model (vllm/config/model.py of 0.32.0):
    the positions cut to the tokenizer's model_max_length, replaced by sentence-transformers'
    max_seq_length where the model has one. A larger --max-model-len makes vLLM refuse to
    start (bge-reranker-base: 514 positions, 512 tokens)."""
    for name in SENTENCE_TRANSFORMERS_CONFIGS:
        if (length := _json_int(folder / name, "max_seq_length")) is not None:
            return length
    tokenizer = _json_int(folder / "tokenizer_config.json", "model_max_length")
    candidates = [value for value in (positions, tokenizer) if value]
    return min(candidates) if candidates else None


SENTENCE_TRANSFORMERS_PROJECTION = "sentence_transformers.models.Dense"
SENTENCE_TRANSFORMERS_POOLING = "Pooling"
"""The end of a pooling module's type in modules.json (sentence_transformers.models.Pooling)."""


def sentence_transformers_modules(folder: Path) -> list[dict[str, Any]] | None:
    """modules.json's modules, or None where the file is missing or unreadable."""
    modules = folder / "modules.json"
    if not modules.exists():
        return None
    try:
        listed = json.loads(read_text(modules, MODEL_JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
        return None
    return listed


def has_pooling_module(folder: Path) -> bool:
    """The model is a sentence-transformers model that pools its output, as vLLM's
    `get_pooling_config` finds one (Qwen3-Embedding: a Qwen3ForCausalLM with last-token
    pooling)."""
    listed = sentence_transformers_modules(folder) or []
    return any(str(m.get("type", "")).endswith(SENTENCE_TRANSFORMERS_POOLING) for m in listed)


def embedding_width(folder: Path, config: Mapping[str, Any]) -> int | None:
    """The width of an embedder's vectors: its hidden size, unless sentence-transformers'
    modules.json projects the pooled vector (a Dense module, which vLLM applies too) or is
    unreadable: then None, unknown here."""
    if (folder / "modules.json").exists():
        listed = sentence_transformers_modules(folder)
        if listed is None or any(m.get("type") == SENTENCE_TRANSFORMERS_PROJECTION for m in listed):
            return None
    return cfg.hidden_size(dict(config))


def _json_int(path: Path, key: str) -> int | None:
    """`key` of the JSON object in `path` where it is a positive whole number; None where the
    file or the number is missing or unreadable."""
    try:
        data = json.loads(read_text(path, MODEL_JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        data = json.loads(read_text(path, MODEL_JSON_MAX_BYTES))
    except FileNotFoundError:
        raise InputError("the model has no config.json", file=path) from None
    except OSError as exc:
        raise InputError(
            f"unreadable config.json: {exc.strerror or exc}",
            file=path,
            fix="the model folder's config.json must be a regular JSON file",
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"unreadable config.json: {exc}", file=path) from None
    if not isinstance(data, dict):
        raise InputError("config.json is not a JSON object", file=path)
    return data


def _support(
    architectures: list[str],
    labels: int,
    vllm_version: str | None,
    vllm_executable: str | None,
    notes: list[str],
    probe_cache: ProbeCache | None = None,
) -> Support:
    if vllm_executable:
        try:
            return support_from_installed(
                architectures, Path(vllm_executable), probe_cache, labels=labels
            )
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
            notes.append(f"the vLLM at {vllm_executable} could not be asked ({exc}): used tables")
    return support_from_table(architectures, vllm_version or pinned_vllm_version(), labels=labels)


def _weights(
    source: ModelSource, config: Mapping[str, Any], notes: list[str]
) -> tuple[int | None, WeightsSource]:
    local = local_weights_bytes(source.folder)
    if local is not None:
        size, kind = local
        return size, "safetensors-index" if kind == "safetensors-index" else "safetensors-header"
    if source.hub_weights_bytes:
        return source.hub_weights_bytes, "hub-metadata"
    derived = cfg.derived_weights_bytes(config)
    if derived is None:
        notes.append("no safetensors metadata and too few config figures: weights unknown")
    else:
        notes.append("no safetensors metadata at hand: weights estimated from config.json")
    return derived, "derived"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def verdict(
    architectures: list[str], support: Support, template: ChatTemplate, launchable: bool
) -> str:
    """One sentence for a person: can it be served, where, and what to do if not."""
    arch = ", ".join(architectures) or "no architecture"
    version = support.vllm_version
    if support.kind == "unsupported":
        return f"not servable: vLLM {version} does not support {arch}"
    if support.kind == "pooling":
        return (
            f"not servable: vLLM {version} runs {arch} as a pooling model that no endpoint "
            "gives (a reward or token-classification head, or a late-interaction retriever)"
        )
    if support.kind == "classify":
        return (
            f"not servable: vLLM {version} runs {arch} as a classifier of several labels; a "
            "reranker has one (config.json's id2label)"
        )
    if support.kind in ("embedding", "rerank"):
        paths = "/v1/embeddings" if support.kind == "embedding" else "/v1/rerank and /v1/score"
        return f"servable: {support.kind} model {arch} on vLLM {version}; {paths}"
    if support.kind == "multimodal" and not launchable:
        return (
            f"not launchable: multimodal {arch} needs a chat template and has none "
            f"({template.status}); give chat_template = <file> in the endpoint file"
        )
    if support.kind == "undetermined":
        lead = f"vLLM {version}'s support for {arch} is undetermined; the health gate will tell"
    else:
        lead = f"servable: {support.kind} model {arch} on vLLM {version}"
    if template.status == "present":
        return f"{lead}; /v1/chat/completions (template from {template.source})"
    hint = "give chat_template = <file> in the endpoint file to enable chat"
    if template.status == "ambiguous":
        hint = f"pick one of the templates {', '.join(template.names)} with chat_template = <file>"
    return f"{lead}; /v1/completions only, no usable chat template ({template.status}): {hint}"
