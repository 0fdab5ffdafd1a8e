"""What vLLM makes of a model's architectures at one vLLM version (docs/sources.md, "vLLM's
architecture registry").

The sections of vLLM's registry say what an architecture is. A generation section wins over
the pooling ones (many causal LMs are also listed as embedding models). A native section wins
over the Transformers-backend one, whose implementing class then says text, multimodal or
pooling. Speculative-decoding drafts are not servable on their own.

The answer comes from the `data/vllm/` table of that version (or the nearest lower one), or,
where a real vLLM is at hand, from that vLLM's own registry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from epycd.childproc import run_bounded
from epycd.engines.vllm.model.registry_tables import (
    SECTIONS,
    Section,
    available_versions,
    choose_table_version,
    load_table,
)
from epycd.model.facts import ModelKind, Support

if TYPE_CHECKING:
    from epycd.host.probe_cache import ProbeCache

GENERATION_SECTIONS = {
    "_TEXT_GENERATION_MODELS": "text",
    "_MULTIMODAL_MODELS": "multimodal",
}
POOLING_SECTIONS: dict[str, ModelKind] = {
    "_EMBEDDING_MODELS": "embedding",
    "_CROSS_ENCODER_MODELS": "rerank",
    "_SEQUENCE_CLASSIFICATION_MODELS": "classify",
    "_LATE_INTERACTION_MODELS": "pooling",
    "_REWARD_MODELS": "pooling",
    "_TOKEN_CLASSIFICATION_MODELS": "pooling",
}
"""The pooling sections, in the order they decide. A sequence classifier of one label is a
reranker (a cross-encoder: vLLM serves it on /v1/rerank and /v1/score), of more a classifier."""
TRANSFORMERS_SECTIONS = ("_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS")
SPECULATIVE_SECTION = "_SPECULATIVE_DECODING_MODELS"

INSTALLED_REGISTRY_TIMEOUT_S = 180.0

REGISTRY_MAX_BYTES = 4 * 1024 * 1024
"""vLLM's registry as one JSON line: every architecture, twice (about 50 KiB)."""
_REGISTRY_DUMP = f"""
import json
import vllm
from vllm import ModelRegistry
from vllm.model_executor.models import registry
sections = {{}}
for name in {list(SECTIONS)!r}:
    entries = getattr(registry, name, None)
    if isinstance(entries, dict):
        sections[name] = {{arch: str(value[-1]) for arch, value in entries.items()}}
print(json.dumps({{
    "version": vllm.__version__,
    "supported": sorted(ModelRegistry.get_supported_archs()),
    "sections": sections,
}}))
"""


def transformers_kind(class_name: str) -> ModelKind:
    """Kind of a Transformers-backend class such as `TransformersMultiModalForCausalLM`."""
    if "Embedding" in class_name:
        return "embedding"
    if "SequenceClassification" in class_name:
        return "classify"
    if any(mark in class_name for mark in ("Reward", "TokenClassification")):
        return "pooling"
    if "MultiModal" in class_name:
        return "multimodal"
    return "text"


POOLING_KINDS: tuple[ModelKind, ...] = ("embedding", "rerank", "classify", "pooling")


def architecture_kind(arch: str, sections: Mapping[str, Section]) -> ModelKind | None:
    """text | multimodal | a pooling kind, 'unsupported' for a draft model, None if vLLM
    lacks it."""
    for section, kind in GENERATION_SECTIONS.items():
        if arch in sections.get(section, {}):
            return "text" if kind == "text" else "multimodal"
    for section in TRANSFORMERS_SECTIONS:
        class_name = sections.get(section, {}).get(arch)
        if class_name is not None and transformers_kind(class_name) not in POOLING_KINDS:
            return transformers_kind(class_name)
    for section, pooling in POOLING_SECTIONS.items():
        if arch in sections.get(section, {}):
            return pooling
    for section in TRANSFORMERS_SECTIONS:
        class_name = sections.get(section, {}).get(arch)
        if class_name is not None:
            return transformers_kind(class_name)
    if arch in sections.get(SPECULATIVE_SECTION, {}):
        return "unsupported"
    return None


def classify(
    architectures: list[str],
    sections: Mapping[str, Section],
    *,
    labels: int = 2,
    previously_supported: Mapping[str, str] | None = None,
) -> tuple[ModelKind, str | None, list[str]]:
    """(kind, the architecture that decided it, warnings). The first known architecture
    decides; a sequence classifier of one label (`labels`, config.json's) is a reranker."""
    notes: list[str] = []
    if not architectures:
        return "undetermined", None, ["config.json lists no architectures"]
    draft: str | None = None
    for arch in architectures:
        kind = architecture_kind(arch, sections)
        if kind == "unsupported":
            draft = draft or arch
        elif kind == "classify" and labels == 1:
            return "rerank", arch, notes
        elif kind is not None:
            return kind, arch, notes
    if draft is not None:
        notes.append(f"{draft} is a speculative-decoding draft model, not servable on its own")
        return "unsupported", draft, notes
    for arch in architectures:
        last = (previously_supported or {}).get(arch)
        if last:
            notes.append(f"{arch} was last supported by vLLM {last}")
    return "unsupported", None, notes


def support_from_table(
    architectures: list[str], vllm_version: str, *, labels: int = 2, tables: Path | None = None
) -> Support:
    chosen, notes = choose_table_version(vllm_version, available_versions(tables))
    if chosen is None:
        return Support(
            supported=None,
            kind="undetermined",
            vllm_version=vllm_version,
            table_version=None,
            warnings=notes,
        )
    table = load_table(chosen, tables)
    kind, _, more = classify(
        architectures,
        table.sections,
        labels=labels,
        previously_supported=table.previously_supported,
    )
    return _support(kind, vllm_version, chosen, "table", [*notes, *more])


def _support(
    kind: ModelKind,
    vllm_version: str,
    table_version: str | None,
    source: Literal["table", "installed-vllm"],
    notes: list[str],
) -> Support:
    return Support(
        supported=None if kind == "undetermined" else kind != "unsupported",
        kind=kind,
        vllm_version=vllm_version,
        table_version=table_version,
        source=source,
        warnings=notes,
    )


def installed_registry(
    vllm_executable: Path,
    *,
    timeout: float = INSTALLED_REGISTRY_TIMEOUT_S,
    cache: ProbeCache | None = None,
) -> tuple[str, frozenset[str], dict[str, Section]]:
    """(version, supported architectures, sections) from the vLLM next to this executable.

    Importing vLLM takes seconds to a minute: one answer per executable and modification time,
    kept across commands in `cache` (the probe cache of the run folder) when one is given.
    """
    python = vllm_executable.parent / "python"
    if not python.exists():
        raise FileNotFoundError(f"no python next to {vllm_executable}")
    if cache is None:
        answer = _ask_registry(str(python), python.stat().st_mtime, timeout)
    else:
        answer = cache.remember(
            str(vllm_executable), "registry", lambda: _dump_registry(str(python), timeout)
        )
    return str(answer["version"]), frozenset(answer["supported"]), answer["sections"]


@cache
def _ask_registry(python: str, mtime: float, timeout: float) -> dict[str, Any]:
    return _dump_registry(python, timeout)


def _dump_registry(python: str, timeout: float) -> dict[str, Any]:
    done = run_bounded(
        [python, "-c", _REGISTRY_DUMP],
        timeout=timeout,
        max_bytes=REGISTRY_MAX_BYTES,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"},
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} could not read vLLM's registry: {tail}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if not isinstance(answer, dict):
        raise ValueError(f"{python} printed no registry")
    return answer


def support_from_installed(
    architectures: list[str],
    vllm_executable: Path,
    cache: ProbeCache | None = None,
    *,
    labels: int = 2,
) -> Support:
    """The installed vLLM is the authority: `get_supported_archs()` says yes or no."""
    version, supported_archs, sections = installed_registry(vllm_executable, cache=cache)
    kind, arch, notes = classify(architectures, sections, labels=labels)
    if kind != "undetermined" and not any(a in supported_archs for a in architectures):
        kind = "unsupported"
    elif (
        kind == "unsupported" and arch is None and any(a in supported_archs for a in architectures)
    ):
        kind = "undetermined"
        notes.append("vLLM lists the architecture but in no section this product knows")
    return _support(kind, version, None, "installed-vllm", notes)
