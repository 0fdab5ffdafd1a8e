"""Chat template status and the endpoints that follow from it (docs/sources.md, "Chat
template status").

A template is only ever found, never invented: an endpoint file's `chat_template` (a path),
else a non-empty `chat_template.jinja`, else a processor's `chat_template.json` (multimodal
repos such as llava-hf ship theirs only there, and vLLM loads it through the processor), else
`tokenizer_config.json`'s `chat_template`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from epycd.errors import InputError
from epycd.model.facts import ChatTemplate, Endpoint, ModelKind
from epycd.readfile import MODEL_JSON_MAX_BYTES, TEMPLATE_MAX_BYTES, read_text

JINJA_FILE = "chat_template.jinja"
PROCESSOR_TEMPLATE = "chat_template.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


def template_from_override(path: str) -> ChatTemplate:
    """The endpoint file's chat_template: a regular UTF-8 file of at most
    `TEMPLATE_MAX_BYTES`, read without blocking (a FIFO or device fails this endpoint)."""
    try:
        text = read_text(path, TEMPLATE_MAX_BYTES)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror or str(exc) if isinstance(exc, OSError) else "not UTF-8 text"
        raise InputError(
            f"chat_template file {path} cannot be read: {reason}",
            file=path,
            key="chat_template",
            fix="give the path of a readable Jinja chat template file (a regular file, at most "
            f"{TEMPLATE_MAX_BYTES // 1024 // 1024} MiB)",
        ) from None
    if not text.strip():
        raise InputError(
            "chat_template file is empty", file=path, key="chat_template", fix="fill it or drop it"
        )
    return ChatTemplate(status="present", names=[], source="the endpoint file")


def template_status(folder: Path | None) -> ChatTemplate:
    if folder is None:
        return ChatTemplate(status="unknown", source=None)
    jinja = folder / JINJA_FILE
    if jinja.exists():
        try:
            if read_text(jinja, TEMPLATE_MAX_BYTES).strip():
                return ChatTemplate(status="present", source=JINJA_FILE)
        except (OSError, UnicodeDecodeError):
            return ChatTemplate(status="unknown", source=JINJA_FILE)
    processor = _read_json(folder / PROCESSOR_TEMPLATE)
    processor_template = processor.get("chat_template") if isinstance(processor, dict) else None
    if isinstance(processor_template, str) and processor_template.strip():
        return ChatTemplate(status="present", source=PROCESSOR_TEMPLATE)
    tokenizer_config = folder / TOKENIZER_CONFIG
    if not tokenizer_config.exists():
        return ChatTemplate(status="unknown", source=None)
    try:
        data = json.loads(read_text(tokenizer_config, MODEL_JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return ChatTemplate(status="unknown", source=TOKENIZER_CONFIG)
    if not isinstance(data, dict):
        return ChatTemplate(status="unknown", source=TOKENIZER_CONFIG)
    return _from_tokenizer_config(data.get("chat_template"))


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(read_text(path, MODEL_JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _from_tokenizer_config(value: Any) -> ChatTemplate:
    if isinstance(value, str):
        status = "present" if value.strip() else "absent"
        return ChatTemplate(status=status, source=TOKENIZER_CONFIG)
    if isinstance(value, list):
        named = [e for e in value if isinstance(e, dict) and isinstance(e.get("template"), str)]
        names = [str(e.get("name", "")) for e in named]
        if not named:
            return ChatTemplate(status="absent", names=names, source=TOKENIZER_CONFIG)
        if "default" in names or len(named) == 1:
            return ChatTemplate(status="present", names=names, source=TOKENIZER_CONFIG)
        return ChatTemplate(status="ambiguous", names=names, source=TOKENIZER_CONFIG)
    if value is None:
        return ChatTemplate(status="absent", source=TOKENIZER_CONFIG)
    return ChatTemplate(status="unknown", source=TOKENIZER_CONFIG)


def endpoints(
    kind: ModelKind, template: ChatTemplate
) -> tuple[Endpoint | None, list[Endpoint], bool]:
    """(primary endpoint, supported endpoints, launchable on its primary endpoint)."""
    chat = template.status == "present"
    if kind in ("text", "undetermined"):
        if chat:
            return "chat_completions", ["chat_completions", "completions"], True
        return "completions", ["completions"], True
    if kind == "multimodal":
        if chat:
            return "chat_completions", ["chat_completions", "completions"], True
        return None, [], False
    if kind == "embedding":
        return "embeddings", ["embeddings"], True
    if kind == "rerank":
        return "rerank", ["rerank", "score"], True
    return None, [], False
