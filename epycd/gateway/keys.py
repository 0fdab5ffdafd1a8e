"""The gateway's client keys (docs/gateway.md, "Keys").

A key is made here, shown once to the admin and never stored: the store,
`STATE_DIR/gateway/keys.json` (root only), keeps each client's name, the SHA-256 of its key
and its limits. HAProxy gets the digests only (`epycd.gateway.haproxy`): it hashes the key a
request carries and looks the digest up.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, ValidationError

from epycd.atomic import write_atomic
from epycd.errors import InputError, validation_error
from epycd.gateway.values import CLIENT_NAME_RULE
from epycd.names import MODEL_NAME_FIX, MODEL_NAME_RULE
from epycd.readfile import STATE_MAX_BYTES, RefusedFile, read_secret
from epycd.settings import Settings

KEY_PREFIX = "sk-epyc-"
"""Keys look like OpenAI's (`sk-...`), so clients and secret scanners treat them as keys."""
KEY_BYTES = 32
STORE_MODE = 0o600
CLIENT_NAME = re.compile(CLIENT_NAME_RULE)
CLIENT_NAME_FIX = "lowercase letters, digits, '_', '.' and '-', at most 63, not starting with one"
MODEL_NAME = re.compile(MODEL_NAME_RULE)
MAX_LIMIT = 10**9 - 1
"""The largest rpm or concurrency: HAProxy's maps hold it as a number (values.LIMIT)."""

ClientName = Annotated[str, Field(pattern=f"^{CLIENT_NAME_RULE}$")]
"""Anchored: pydantic's `pattern` matches anywhere in the string without ^ and $."""
ModelName = Annotated[str, Field(pattern=f"^{MODEL_NAME_RULE}$")]


class ClientKey(BaseModel):
    """One client of the gateway: its name (in the gateway's log and metrics, never the key),
    its key's digest and what it may do."""

    name: ClientName
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    models: list[ModelName] | None = Field(
        default=None, description="the models it may use; None: every model the gateway routes"
    )
    rpm: int | None = Field(
        default=None, gt=0, le=MAX_LIMIT, description="requests per minute; None: no limit"
    )
    concurrency: int | None = Field(
        default=None, gt=0, le=MAX_LIMIT, description="requests at once; None: no limit"
    )
    added_at: datetime


class KeyStore(BaseModel):
    keys: list[ClientKey] = []

    def named(self, name: str) -> ClientKey | None:
        return next((key for key in self.keys if key.name == name), None)


def store_path(settings: Settings) -> Path:
    return settings.state_dir / "gateway" / "keys.json"


def read_store(settings: Settings) -> KeyStore:
    """The keys, none when the store does not exist yet; a damaged store is an error naming
    it (the gateway is then not changed). The store is root's alone, as a key file is
    (`epycd.readfile.read_secret`): one that someone else owns, may read or write, or whose
    folders someone else may write, is refused with the fix, since whoever can write it can
    add a key. A caller who may not read it gets `PermissionError`."""
    path = store_path(settings)
    try:
        raw = read_secret(path, STATE_MAX_BYTES)
    except FileNotFoundError:
        return KeyStore()
    except RefusedFile as exc:
        if exc.errno == errno.EPERM:
            said = f"{exc.strerror}: someone but root could read or change the gateway's keys"
            raise InputError(said, file=path, fix=exc.fix) from None
        raise InputError(str(exc.strerror), file=path, fix="restore it from a backup") from None
    try:
        return KeyStore.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc, file=path, fix="restore the file from a backup") from None


def write_store(settings: Settings, store: KeyStore) -> None:
    text = json.dumps(store.model_dump(mode="json", exclude_none=True), indent=2) + "\n"
    write_atomic(store_path(settings), text.encode(), STORE_MODE)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def checked_client_name(name: str) -> str:
    if CLIENT_NAME.fullmatch(name) is None:
        raise InputError(f"{name!r} is not a client name", key="NAME", fix=CLIENT_NAME_FIX)
    return name


def checked_models(models: list[str]) -> list[str]:
    for model in models:
        if MODEL_NAME.fullmatch(model) is None:
            raise InputError(f"{model!r} is not a model name", key="--models", fix=MODEL_NAME_FIX)
    return sorted(set(models))


def add_key(
    store: KeyStore,
    name: str,
    *,
    models: list[str] | None,
    rpm: int | None,
    concurrency: int | None,
    now: datetime | None = None,
) -> tuple[KeyStore, str]:
    """The store with a new client `name`, and its key (to show once)."""
    checked_client_name(name)
    if store.named(name) is not None:
        raise InputError(
            f"a key named {name!r} exists",
            key="NAME",
            fix=f"revoke it first (`epycctl gateway revoke {name}`) or choose another name",
        )
    key = new_key()
    client = ClientKey(
        name=name,
        sha256=digest(key),
        models=checked_models(models) if models is not None else None,
        rpm=rpm,
        concurrency=concurrency,
        added_at=now or datetime.now(UTC),
    )
    return KeyStore(keys=[*store.keys, client]), key


def revoke_key(store: KeyStore, name: str) -> KeyStore:
    if store.named(checked_client_name(name)) is None:
        known = ", ".join(key.name for key in store.keys) or "none"
        raise InputError(f"no key named {name!r}", key="NAME", fix=f"the keys: {known}")
    return KeyStore(keys=[key for key in store.keys if key.name != name])
