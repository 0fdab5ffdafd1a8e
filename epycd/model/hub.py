"""Where a model's small files come from: the hub (bounded), the local HF cache, or a folder.

Only `huggingface_hub` talks to the hub and reads its cache. The environment is read at call
time (`HF_HUB_OFFLINE`, `HF_HOME`/`HF_HUB_CACHE`, `HF_ENDPOINT`, `HF_HUB_ETAG_TIMEOUT`), so a
caller or a test can move it. Online, every request has a timeout; when the hub cannot be
reached the answer comes from the local cache with a warning, or a clear error says the model
is not there. Nothing here waits longer than the timeout for a closed or silent hub.

A revision and a repository's file name are checked before huggingface_hub joins them to its
cache folder (`epycd.names`), and any other refusal of its own (a ValueError) becomes one
line naming the key: never its text, which can quote a file it read as a commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from huggingface_hub import HfApi, ModelInfo, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.tqdm import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
)

from epycd.errors import InputError, Refusal
from epycd.model.weights import bytes_from_parameter_counts
from epycd.names import REVISION_FIX, repo_file_problem, revision_problem

SMALL_FILES = [
    "config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "*.safetensors.index.json",
    "sentence_*_config.json",
    "modules.json",
]
DEFAULT_TIMEOUT_S = 10.0
TRUE_WORDS = {"1", "on", "yes", "true"}


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Network failures of whichever HTTP client this huggingface_hub uses (httpx, httpx2, or
    requests before huggingface_hub 1.0)."""
    errors: list[type[BaseException]] = [httpx.TransportError]
    try:
        import httpx2

        errors.append(httpx2.TransportError)
    except ImportError:
        pass
    try:
        import requests  # type: ignore[import-untyped,unused-ignore]

        errors.extend([requests.ConnectionError, requests.Timeout])
    except ImportError:
        pass
    return tuple(errors)


class HubTrouble(Exception):
    """The hub answered, but not usefully (5xx, an unexpected status): use the cache."""


UNREACHABLE: tuple[type[BaseException], ...] = (
    *_transport_errors(),
    OfflineModeIsEnabled,
    LocalEntryNotFoundError,
    HubTrouble,
)


@dataclass(frozen=True)
class HubEnvironment:
    offline: bool
    cache_dir: Path
    endpoint: str
    timeout: float

    @classmethod
    def from_environ(cls) -> HubEnvironment:
        env = os.environ
        offline = any(
            env.get(name, "").strip().lower() in TRUE_WORDS
            for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
        )
        hf_home = Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
        cache_dir = Path(env.get("HF_HUB_CACHE") or hf_home / "hub").expanduser()
        try:
            timeout = float(env.get("HF_HUB_ETAG_TIMEOUT") or DEFAULT_TIMEOUT_S)
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        endpoint = (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        return cls(offline=offline, cache_dir=cache_dir, endpoint=endpoint, timeout=timeout)


@dataclass
class ModelSource:
    """A folder holding the model's small files, and what the hub said about it."""

    folder: Path
    revision: str | None
    from_hub: bool
    gated: bool | None = None
    hub_weights_bytes: int | None = None
    warnings: list[str] = field(default_factory=list)


def locate_model(
    model: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    env: HubEnvironment | None = None,
) -> ModelSource:
    if model.startswith("/"):
        return _local_folder(Path(model))
    _check_repo_id(model)
    check_revision(revision)
    env = env or HubEnvironment.from_environ()
    notes: list[str] = []
    if not env.offline:
        try:
            return _from_hub(model, revision, token, env)
        except UNREACHABLE as exc:
            notes.append(
                f"the hub at {env.endpoint} could not be reached ({_reason(exc)}): "
                "answered from the local cache"
            )
    source = _from_cache(model, revision, env, unreachable=bool(notes))
    source.warnings[:0] = notes
    return source


def _local_folder(folder: Path) -> ModelSource:
    if not (folder / "config.json").exists():  # one that is not a file: read_config says so
        raise InputError(
            "no config.json in the model folder",
            file=folder,
            fix="MODEL is a hub id (org/name) or the absolute path of a model folder",
        )
    return ModelSource(folder=folder, revision=None, from_hub=False)


def _check_repo_id(model: str) -> None:
    """org/name; the characters are checked by huggingface_hub itself (HFValidationError)."""
    if model.count("/") != 1 or not all(model.split("/")):
        raise InputError(
            f"{model!r} is neither a hub id of the form org/name nor an absolute path",
            key="model",
            fix="use org/name (e.g. Qwen/Qwen3-0.6B) or an absolute path to a model folder",
        )


def check_revision(revision: str | None) -> None:
    """A branch, tag or commit (`revision_problem`): bad input before the hub sees it."""
    if revision is not None and (problem := revision_problem(revision)) is not None:
        raise InputError(f"{revision!r} {problem}", key="revision", fix=REVISION_FIX)


def check_repo_file(name: str) -> None:
    """A file's name inside a repository or folder (`repo_file_problem`): bad input before
    it is joined to a folder."""
    if (problem := repo_file_problem(name)) is not None:
        raise InputError(
            f"{name!r} {problem}",
            key="gguf_file",
            fix="give the .gguf file's name inside the repository or folder, e.g. "
            "model-Q4_K_M.gguf",
        )


def _cache_refused(model: str, revision: str | None, file: str | None = None) -> InputError:
    """huggingface_hub's own ValueError for a revision and file that passed our checks (its
    cache's `refs/REVISION` holds no commit), without its text: it can quote that file."""
    what = f"{file} at revision {revision or 'main'}" if file else f"revision {revision or 'main'}"
    return InputError(
        f"{model}: huggingface_hub refused {what} as a path in its cache",
        key="revision",
        fix=f"download it again (`hf download {model}`), or give a commit's 40 hex digits",
    )


def _invalid_name(model: str, exc: HFValidationError) -> InputError:
    return InputError(
        f"{model!r} is not a valid hub id: {exc}",
        key="model",
        fix="use org/name (e.g. Qwen/Qwen3-0.6B) or an absolute path to a model folder",
    )


@contextmanager
def _quiet() -> Iterator[None]:
    """No download progress bars on a person's terminal for a few small files."""
    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


def _from_hub(
    model: str, revision: str | None, token: str | None, env: HubEnvironment
) -> ModelSource:
    try:
        info, folder = _download_small_files(model, revision, token, env)
    except HFValidationError as exc:
        raise _invalid_name(model, exc) from None
    except GatedRepoError:
        raise Refusal(
            f"{model} is gated and this token has no access",
            key="hf_token_file",
            fix=f"accept the licence at {env.endpoint}/{model} and give a token "
            "(HF_TOKEN or hf_token_file)",
        ) from None
    except RevisionNotFoundError:
        raise InputError(
            f"{model} has no revision {revision!r}",
            key="revision",
            fix="use a branch, tag or commit",
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"{model} is not on the hub (or is private and needs a token)",
            key="model",
            fix="check the name, or give a token with access (HF_TOKEN or hf_token_file)",
        ) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubTrouble(f"the hub answered HTTP {status}") from exc
    except ValueError:
        raise _cache_refused(model, revision) from None
    return _hub_source(info, Path(folder))


def _download_small_files(
    model: str, revision: str | None, token: str | None, env: HubEnvironment
) -> tuple[ModelInfo, str]:
    """The hub's facts of the model and the snapshot folder of its `SMALL_FILES`."""
    api = HfApi(endpoint=env.endpoint, token=token)
    info = api.model_info(
        model, revision=revision, timeout=env.timeout, expand=["gated", "safetensors", "sha"]
    )
    with _quiet():
        # the requested ref, not info.sha: only then does the cache record refs/<ref>
        # and answer for it offline later
        folder = snapshot_download(
            model,
            revision=revision,
            cache_dir=env.cache_dir,
            allow_patterns=SMALL_FILES,
            token=token,
            etag_timeout=env.timeout,
            endpoint=env.endpoint,
        )
    return info, folder


def _hub_source(info: ModelInfo, folder: Path) -> ModelSource:
    gated = bool(info.gated) if info.gated is not None else None
    hub_bytes = None
    if info.safetensors is not None and info.safetensors.parameters:
        hub_bytes = bytes_from_parameter_counts(info.safetensors.parameters)
    return ModelSource(
        folder=folder,
        revision=folder.name,
        from_hub=True,
        gated=gated,
        hub_weights_bytes=hub_bytes,
    )


def _from_cache(
    model: str, revision: str | None, env: HubEnvironment, *, unreachable: bool
) -> ModelSource:
    try:
        folder = Path(
            snapshot_download(
                model,
                revision=revision,
                cache_dir=env.cache_dir,
                allow_patterns=SMALL_FILES,
                local_files_only=True,
            )
        )
    except HFValidationError as exc:
        raise _invalid_name(model, exc) from None
    except ValueError:
        raise _cache_refused(model, revision) from None
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        why = "the hub is unreachable" if unreachable else "offline (HF_HUB_OFFLINE)"
        at = f" at revision {revision}" if revision else ""
        raise Refusal(
            f"{model}{at} is not in the local cache {env.cache_dir} and {why}",
            key="model",
            fix=f"download it where the hub is reachable (`hf download {model}`) into "
            "this HF_HOME, or give an absolute path to a model folder",
        ) from None
    if not (folder / "config.json").exists():
        raise Refusal(
            f"{model}: the cached snapshot {folder.name} has no config.json",
            file=folder,
            fix=f"download it again (`hf download {model}`)",
        )
    return ModelSource(folder=folder, revision=folder.name, from_hub=False, gated=None)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


GGUF_SUFFIX = ".gguf"


@dataclass
class GgufSource:
    """One GGUF file at hand: a local file, or a repository's file in the local HF cache."""

    path: Path
    name: str
    revision: str | None
    warnings: list[str] = field(default_factory=list)


def is_gguf(model: str, gguf_file: str | None) -> bool:
    return gguf_file is not None or model.lower().endswith(GGUF_SUFFIX)


def locate_gguf(
    model: str,
    gguf_file: str | None,
    *,
    revision: str | None = None,
    env: HubEnvironment | None = None,
) -> GgufSource:
    """The GGUF file `model` names: an absolute .gguf path, a folder's `gguf_file`, or a hub
    repository's `gguf_file` at `revision`. A repository's file is the weights themselves, so
    it is never downloaded here: it must be in the local HF cache, and when it is not the
    error gives the download command."""
    if gguf_file is not None:
        check_repo_file(gguf_file)
    if model.startswith("/"):
        path = Path(model) / gguf_file if gguf_file else Path(model)
        if not path.exists():
            raise InputError(
                "no such GGUF file", file=path, fix="give the absolute path of a .gguf file"
            )
        return GgufSource(path=path, name=gguf_file or path.name, revision=None)
    _check_repo_id(model)
    if not gguf_file:
        raise InputError(
            f"{model}: a hub repository holds many GGUF files: name the one to serve",
            key="gguf_file",
            fix="give gguf_file = the file's name in the repository (e.g. model-Q4_K_M.gguf)",
        )
    check_revision(revision)
    env = env or HubEnvironment.from_environ()
    try:
        cached = hf_hub_download(
            model, gguf_file, revision=revision, cache_dir=env.cache_dir, local_files_only=True
        )
    except HFValidationError as exc:
        raise _invalid_name(model, exc) from None
    except ValueError:
        raise _cache_refused(model, revision, gguf_file) from None
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        raise _gguf_not_cached(model, gguf_file, revision, env.cache_dir) from None
    path = Path(cached)
    return GgufSource(path=path, name=gguf_file, revision=path.parent.name)


def _gguf_not_cached(model: str, gguf_file: str, revision: str | None, cache: Path) -> Refusal:
    at = f" --revision {revision}" if revision else ""
    return Refusal(
        f"{model}: {gguf_file}{' at ' + revision if revision else ''} is not in the local "
        f"cache {cache} (the weights themselves: never downloaded by a check)",
        key="gguf_file",
        fix=f"download it into this HF_HOME (`hf download {model} {gguf_file}{at}`), "
        "or give the absolute path of a .gguf file",
    )
