"""The root-only secret files an endpoint file names: the HF token (`read_token`) and the
API key (`check_api_key` at plan time, `read_api_key` for `epycctl bench`), read by
ssh's rule (`read_root_only`); a non-root caller that may not read them is told so
(`UnreadableHere`, `unreadable_here`). The plan never copies a secret anywhere."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from epycd.errors import InputError
from epycd.readfile import SECRET_MAX_BYTES, RefusedFile, read_secret
from epycd.spec import EndpointSpec

BARE_TOKEN = re.compile(r"[A-Za-z0-9_.-]+")
"""What a token file may hold (around surrounding whitespace): the token, nothing else. The
file reaches huggingface_hub through HF_TOKEN_PATH, which takes its whole text as the token."""


def read_root_only(
    path: Path, file: Path, key: str, holding: str, *, group_gid: int | None = None
) -> str:
    """The stripped text of a secret file (hf_token_file, api_key_file) that only root
    controls: a regular file of at most `SECRET_MAX_BYTES`, owned by root and readable by
    nobody else (or by `group_gid`, root's admin group), in folders only root can write
    (`epycd.readfile.secret_problem`, ssh's rule). Read without blocking, so a FIFO or a
    device named here fails this endpoint alone. The plan never copies it anywhere."""
    create = f"create the file holding {holding}, owned by root, mode 0600"
    try:
        text = read_secret(path, SECRET_MAX_BYTES, group_gid=group_gid).decode("utf-8").strip()
    except PermissionError:
        if os.geteuid() != 0:
            raise UnreadableHere(path, file=file, key=key) from None
        raise InputError(
            f"cannot read {path}: permission denied", file=file, key=key, fix=create
        ) from None
    except RefusedFile as exc:
        if exc.errno == errno.EPERM:
            raise InputError(
                f"{exc.strerror}: someone but root could know or change {holding}",
                file=file,
                key=key,
                fix=exc.fix,
            ) from None
        raise InputError(f"{path} {exc.strerror}", file=file, key=key, fix=create) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InputError(f"cannot read {path}: {reason}", file=file, key=key, fix=create) from None
    return text


class UnreadableHere(InputError):
    """A root-only file that this non-root process may not read (`epycctl status` as a
    user): the plan cannot be made by this user, the endpoint has not changed for it."""

    def __init__(self, path: Path, *, file: Path, key: str) -> None:
        super().__init__(
            f"cannot read {path} as uid {os.geteuid()} (it is root-only, as it should be)",
            file=file,
            key=key,
            fix="run it as root to plan this endpoint",
        )
        self.path = str(path)


def unreadable_here(path: Path) -> str | None:
    """`path` when this non-root process may not read it (a root-only endpoint file)."""
    if os.geteuid() == 0 or os.access(path, os.R_OK) or not path.exists():
        return None
    return str(path)


def read_token(spec: EndpointSpec, file: Path, group_gid: int | None = None) -> str | None:
    """The HF token from a root-only file; the plan never copies it anywhere."""
    if spec.hf_token_file is None:
        return None
    path = Path(spec.hf_token_file)
    text = read_root_only(path, file, "hf_token_file", "the token", group_gid=group_gid)
    if not text:
        raise InputError(f"{path} is empty", file=file, key="hf_token_file", fix="add the token")
    if not BARE_TOKEN.fullmatch(text):
        raise InputError(
            f"{path} holds more than a bare token (a `HF_TOKEN=` assignment, quotes, spaces or "
            "several lines); vLLM reads the whole file as the token",
            file=file,
            key="hf_token_file",
            fix=f"write only the token itself (hf_...) into {path}, on one line",
        )
    return text


API_KEY_TEXT = re.compile(r"[\x21-\x7e]{1,4096}")
"""Printable ASCII without spaces: the key travels in an `Authorization: Bearer` header."""


def check_api_key(spec: EndpointSpec, file: Path, group_gid: int | None = None) -> None:
    """The API key file holds one key that clients can send; its text is never shown."""
    if spec.api_key_file is None:
        return
    path = Path(spec.api_key_file)
    if os.geteuid() != 0 and path.exists() and not os.access(path, os.R_OK):
        return  # only root reads it: the plan does not depend on the key, approve checks it
    read_api_key(path, file, group_gid)


def read_api_key(path: Path, file: Path, group_gid: int | None = None) -> str:
    """The one key of a root-only api_key_file, as clients send it (`check_api_key` at plan
    time, `epycctl bench` when it calls the endpoint)."""
    key = read_root_only(path, file, "api_key_file", "the API key", group_gid=group_gid)
    if key.startswith("VLLM_API_KEY="):
        raise InputError(
            f"{path} holds VLLM_API_KEY=..., not the key alone",
            file=file,
            key="api_key_file",
            fix=f"write only the key into {path}",
        )
    if not API_KEY_TEXT.fullmatch(key):
        raise InputError(
            f"{path} is empty or its key has spaces, several lines or non-ASCII characters",
            file=file,
            key="api_key_file",
            fix=f"write one key of printable ASCII characters, on one line, into {path}",
        )
    return key
