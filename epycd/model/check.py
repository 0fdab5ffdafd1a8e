"""Model facts for one model: what vLLM makes of it, its template, endpoints and sizes.

The one entry point of the model stage (`inspect_model`); the CLI and the planner call it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from epycd import engines
from epycd.errors import InputError
from epycd.model import config as cfg
from epycd.model.facts import ChatTemplate, EngineSupport, ModelFacts, Support
from epycd.model.formats import ModelFormat, format_of, in_registry_order, model_formats
from epycd.model.hub import ModelSource, locate_model
from epycd.model.registry_tables import Section, data_dir
from epycd.model.support import is_scoring, support_from_installed, support_from_table
from epycd.model.template import endpoints, template_from_override, template_status
from epycd.model.weights import local_weights_bytes
from epycd.readfile import MODEL_JSON_MAX_BYTES, read_text

if TYPE_CHECKING:
    from epycd.host.probe_cache import ProbeCache

FALLBACK_VLLM_VERSION = "0.25.1"
WeightsSource = Literal[
    "safetensors-header", "safetensors-index", "hub-metadata", "derived", "gguf-tensors"
]


def pinned_vllm_version() -> str:
    """`vllm_version` of data/epyc.json, else the validated default."""
    stack = data_dir() / "epyc.json"
    try:
        version = json.loads(stack.read_text()).get("vllm_version")
    except (OSError, ValueError, AttributeError):
        return FALLBACK_VLLM_VERSION
    return str(version) if version else FALLBACK_VLLM_VERSION


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
    """`gguf_file`: the GGUF file of a hub repository or folder; a model in an engine's own
    format (`epycd.model.formats`: a .gguf file, or one given by `gguf_file`) is read by that
    format, every other one as vLLM reads it."""
    own_format = format_of(model, gguf_file)
    if own_format is not None:
        version = vllm_version or pinned_vllm_version()
        return own_format.inspect(
            model,
            file=gguf_file,
            revision=revision,
            chat_template_override=chat_template_override,
            others=[_vllm_refusal(own_format, version)],
            support=Support(
                supported=False, kind="unsupported", vllm_version=version, table_version=None
            ),
        )
    source = locate_model(model, revision=revision, token=token)
    config = read_config(source.folder)
    architectures = [str(a) for a in config.get("architectures") or []]
    notes = list(source.warnings)

    support, sections = _support(architectures, vllm_version, vllm_executable, notes, probe_cache)
    template = _chat_template(chat_template_override, source.folder)
    scoring = any(is_scoring(a, sections) for a in architectures)
    primary, supported_endpoints, launchable = endpoints(support.kind, template, scoring=scoring)
    weights_bytes, weights_source = _weights(source, config, notes)
    kv_per_token = cfg.kv_bytes_per_token(config)
    if kv_per_token is None:
        notes.append("config.json lacks the layer/head figures: KV bytes per token unknown (0)")

    message = verdict(architectures, support, template, launchable)
    return ModelFacts(
        model=model,
        engines=in_registry_order(
            [
                _vllm_engine(support, message, launchable),
                *(f.elsewhere().model_copy(update={"kind": support.kind}) for f in model_formats()),
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
        is_mla=cfg.is_mla(config),
        message=message,
        warnings=[*notes, *support.warnings],
    )


def _vllm_engine(support: Support, message: str, launchable: bool) -> EngineSupport:
    supported = support.supported if launchable or support.supported is None else False
    return EngineSupport(
        engine="vllm",
        version=support.vllm_version,
        supported=supported,
        kind=support.kind,
        reason=message,
    )


def _vllm_refusal(own_format: ModelFormat, version: str) -> EngineSupport:
    """vLLM's answer on a model in another engine's format."""
    title = engines.engine_named(own_format.engine).title
    return EngineSupport(
        engine="vllm",
        version=version,
        supported=False,
        kind="unsupported",
        reason=f"vLLM {version} cannot serve it: {own_format.vllm_refusal}; serve it with {title}",
    )


def _chat_template(override: str | None, folder: Path) -> ChatTemplate:
    """The endpoint file's chat_template when given, else the model folder's own."""
    return template_from_override(override) if override else template_status(folder)


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
    vllm_version: str | None,
    vllm_executable: str | None,
    notes: list[str],
    probe_cache: ProbeCache | None = None,
) -> tuple[Support, Mapping[str, Section]]:
    if vllm_executable:
        try:
            return support_from_installed(architectures, Path(vllm_executable), probe_cache)
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
            notes.append(f"the vLLM at {vllm_executable} could not be asked ({exc}): used tables")
    return support_from_table(architectures, vllm_version or pinned_vllm_version())


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
            f"not servable as chat or completions: vLLM {version} runs {arch} as a pooling "
            "(embedding/scoring) model"
        )
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
