"""Endpoint files: `CONFIG_DIR/NAME.toml`, one vLLM endpoint each (design.md, "Endpoint file").

Loading never stops at a bad file: `load_endpoints` returns one `SpecResult` per file, with
the validated spec or every error found in it. An error names the file and the key and says
what is allowed. Values that could smuggle text into a unit (control characters, newlines)
or fight the plan (env the tuning owns, flags the plan owns, a secret in the env) are errors.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from epycd.errors import InputError

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
HUB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
ENV_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
"""Control characters, surrogates, line and paragraph separators: never in a unit."""

ENV_OWNED_BY_PLAN: dict[str, str] = {
    "OMP_NUM_THREADS": "never set: vLLM derives it from the bind list",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "never set: vLLM's own default applies",
    "VLLM_CPU_OMP_THREADS_BIND": "set by the plan: the instance's physical cores but the "
    "front end's (docs/tuning.md rule 1)",
    "VLLM_CPU_KVCACHE_SPACE": "set by the plan from max_num_seqs, max_model_len and the "
    "nodes' memory (docs/tuning.md rule 3)",
    "HF_TOKEN": "a secret: put it in a root-only file and name it in hf_token_file",
    "HUGGING_FACE_HUB_TOKEN": "a secret: put it in a root-only file and name it in hf_token_file",
    "TORCHINDUCTOR_FREEZING": "one of the throughput set: use throughput_flags = true",
    "VLLM_USE_AOT_COMPILE": "one of the throughput set: use throughput_flags = true",
    "ZENTORCH_WEIGHT_PREPACK": "one of the throughput set: use throughput_flags = true",
}

ARGS_OWNED_BY_PLAN: dict[str, str] = {
    "--device": "vllm serve >= 0.20 rejects it",
    "--shm-size": "the container runs with --ipc=host",
    "--port": "use the port key",
    "--host": "the endpoint listens as the plan decides",
    "--model": "use the model key",
    "--dtype": "use the dtype key",
    "--max-model-len": "use the max_model_len key",
    "--max-num-seqs": "use the max_num_seqs key",
    "--served-model-name": "use the served_model_name key",
    "--chat-template": "use the chat_template key",
    "--revision": "use the revision key",
    "--kv-cache-memory-bytes": "the plan sizes the KV pool",
    "--gpu-memory-utilization": "the plan sizes the KV pool",
    "--distributed-executor-backend": "one instance runs on one socket",
    "--tensor-parallel-size": "one instance runs on one socket",
    "--pipeline-parallel-size": "one instance runs on one socket",
}

ALLOWED: dict[str, str] = {
    "model": "a Hugging Face id like 'Qwen/Qwen3-0.6B' or an absolute path to a model folder",
    "revision": "a branch, tag or commit: letters, digits, '.', '_', '-', '/'",
    "dtype": "one of the stack's precisions",
    "max_model_len": "a positive integer (tokens)",
    "max_num_seqs": "a positive integer (concurrent sequences)",
    "port": 'an integer 1-65535 or "auto"',
    "runtime": '"auto", "podman", "docker" or "host"',
    "socket": '"auto" or a socket number (0, 1, ...)',
    "image": "a container image reference like 'repo/name:tag'",
    "vllm": "an absolute path to the vllm executable of a venv or conda env",
    "served_model_name": "a name without spaces or control characters",
    "chat_template": "an absolute path to a chat template file",
    "extra_args": "a list of strings, without flags the plan owns",
    "env": 'a table of NAME = "value" strings; NAME like [A-Za-z_][A-Za-z0-9_]*',
    "hf_token_file": "an absolute path to a root-only file holding the token",
    "throughput_flags": "true or false",
    "restart": '"no" or "on-failure"',
    "profile": '"balanced" (default), "latency" or "throughput" (docs/tuning.md)',
}

PathText = Annotated[str, Field(min_length=2, pattern=r"^/")]


class EndpointSpec(BaseModel):
    """One endpoint file, validated; `None` means "the stack's default"."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model: str | None = None
    revision: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._/-]{1,200}$")
    dtype: str | None = None
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    port: int | Literal["auto"] = "auto"
    runtime: Literal["auto", "podman", "docker", "host"] = "auto"
    socket: int | Literal["auto"] = "auto"
    image: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
    vllm: PathText | None = None
    served_model_name: str | None = Field(default=None, pattern=r"^[^\s]{1,200}$")
    chat_template: PathText | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    hf_token_file: PathText | None = None
    throughput_flags: bool = False
    restart: Literal["no", "on-failure"] = "no"
    profile: Literal["balanced", "latency", "throughput"] = "balanced"

    @field_validator("model")
    @classmethod
    def _model_is_hub_id_or_absolute(cls, value: str | None) -> str | None:
        if value is None or value.startswith("/") or HUB_ID_PATTERN.fullmatch(value):
            return value
        raise ValueError(f"{value!r} is neither an org/name hub id nor an absolute path")

    @field_validator("port")
    @classmethod
    def _port_in_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 65535:
            raise ValueError(f"port {value} is outside 1-65535")
        return value

    @field_validator("socket")
    @classmethod
    def _socket_not_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"socket {value} is negative")
        return value


@dataclass(frozen=True)
class SpecResult:
    """One endpoint file: its spec when valid, else every error found in it."""

    name: str
    path: Path
    spec: EndpointSpec | None
    errors: list[InputError] = field(default_factory=list)
    content_sha256: str = ""

    @property
    def ok(self) -> bool:
        return self.spec is not None and not self.errors


def _walk_strings(value: Any, key: str) -> list[tuple[str, str]]:
    if isinstance(value, str):
        return [(key, value)]
    if isinstance(value, dict):
        found = []
        for sub_key, sub_value in value.items():
            found += _walk_strings(str(sub_key), f"{key}.{sub_key}" if key else "key")
            found += _walk_strings(sub_value, f"{key}.{sub_key}" if key else str(sub_key))
        return found
    if isinstance(value, list):
        return [hit for i, item in enumerate(value) for hit in _walk_strings(item, f"{key}[{i}]")]
    return []


def _unsafe_text_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    errors = []
    for key, text in _walk_strings(data, ""):
        bad = next((ch for ch in text if unicodedata.category(ch) in UNSAFE_CATEGORIES), None)
        if bad is not None:
            errors.append(
                InputError(
                    f"contains the control character {bad!r} (newlines and control "
                    "characters could add lines to a unit file)",
                    file=path,
                    key=key,
                    fix="write the value on one line without control characters",
                )
            )
    return errors


def _error_key(loc: tuple[int | str, ...]) -> str:
    """`env.NAME` and `extra_args[i]` for items; union member names are dropped."""
    top = str(loc[0]) if loc else ""
    if top == "env" and len(loc) > 1:
        return f"env.{loc[1]}"
    if top == "extra_args" and len(loc) > 1 and isinstance(loc[1], int):
        return f"extra_args[{loc[1]}]"
    return top


def _error_message(error: ErrorDetails) -> str:
    got = error.get("input")
    if len(error["loc"]) > 1 and error["loc"][0] not in ("env", "extra_args"):
        return f"{got!r} is not allowed"
    if error["type"] in ("value_error", "greater_than"):
        return str(error["msg"]).removeprefix("Value error, ")
    if error["type"] in ("string_pattern_mismatch", "literal_error", "string_too_short"):
        return f"{got!r} is not allowed"
    return f"{error['msg'].lower()}, got {type(got).__name__} {got!r}"


def _validation_errors(
    path: Path, exc: ValidationError, reported: set[str | None]
) -> list[InputError]:
    errors: list[InputError] = []
    seen = set(reported)
    for error in exc.errors():
        key = _error_key(error["loc"])
        if key in seen:
            continue
        seen.add(key)
        if error["type"] == "extra_forbidden":
            message = "unknown key"
            fix = "allowed keys: " + ", ".join(EndpointSpec.model_fields)
        else:
            message = _error_message(error)
            fix = f"allowed: {ALLOWED.get(key.split('.')[0].split('[')[0], 'see design.md')}"
        errors.append(InputError(message, file=path, key=key, fix=fix))
    return errors


def _forbidden_arg(arg: str) -> tuple[str, str] | None:
    if not arg.startswith("--") or arg == "--":
        return None
    flag = arg.split("=", 1)[0].replace("_", "-")
    for owned, why in ARGS_OWNED_BY_PLAN.items():
        if flag == owned or owned.startswith(flag):
            return owned, why
    return None


def _policy_errors(path: Path, data: dict[str, Any], precisions: list[str]) -> list[InputError]:
    """Values of the right type that the plan cannot accept; read from the raw table so that
    they are reported together with type errors."""
    errors = []
    dtype = data.get("dtype")
    if isinstance(dtype, str) and dtype not in precisions:
        errors.append(
            InputError(
                f"{dtype!r} is not a supported precision",
                file=path,
                key="dtype",
                fix="allowed: " + ", ".join(precisions),
            )
        )
    env = data.get("env")
    for env_key in env if isinstance(env, dict) else {}:
        if not ENV_KEY_PATTERN.fullmatch(env_key):
            errors.append(
                InputError(
                    f"{env_key!r} is not a valid variable name",
                    file=path,
                    key=f"env.{env_key}",
                    fix="allowed: names like [A-Za-z_][A-Za-z0-9_]*",
                )
            )
        elif env_key.upper() in ENV_OWNED_BY_PLAN:
            errors.append(
                InputError(
                    f"{env_key} may not be set here",
                    file=path,
                    key=f"env.{env_key}",
                    fix=ENV_OWNED_BY_PLAN[env_key.upper()],
                )
            )
    served = data.get("served_model_name")
    if served == ";":
        errors.append(
            InputError(
                "a lone ';' would end the command line of the unit",
                file=path,
                key="served_model_name",
                fix="choose another name",
            )
        )
    args = data.get("extra_args")
    for index, arg in enumerate(args if isinstance(args, list) else []):
        owned = _forbidden_arg(arg) if isinstance(arg, str) else None
        if arg in ("", ";"):
            errors.append(
                InputError(
                    "an empty argument or a lone ';' cannot be passed through a unit's command "
                    "line (Quadlet drops empty words; systemd reads ';' as a second command)",
                    file=path,
                    key=f"extra_args[{index}]",
                    fix="remove it, or join it to its flag: --flag=value",
                )
            )
        elif owned:
            errors.append(
                InputError(
                    f"{arg!r} is not allowed in extra_args ({owned[0]}: {owned[1]})",
                    file=path,
                    key=f"extra_args[{index}]",
                    fix="remove it; " + ALLOWED["extra_args"],
                )
            )
    return errors


def parse_endpoint(path: Path, raw: bytes, *, precisions: list[str]) -> SpecResult:
    """The endpoint file `path` with content `raw`, validated; never raises."""
    name = path.stem
    digest = hashlib.sha256(raw).hexdigest()

    def failed(*errors: InputError) -> SpecResult:
        return SpecResult(name, path, None, list(errors), digest)

    if not NAME_PATTERN.fullmatch(name):
        return failed(
            InputError(
                f"{name!r} is not a valid endpoint name",
                file=path,
                key="file name",
                fix="rename the file: lowercase letters, digits and '-', at most 63, "
                "starting with a letter or digit, ending in .toml",
            )
        )
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return failed(InputError("is not UTF-8 text", file=path, fix="save it as UTF-8"))
    except tomllib.TOMLDecodeError as exc:
        return failed(InputError(f"is not valid TOML: {exc}", file=path, fix="fix the syntax"))
    errors = _unsafe_text_errors(path, data) + _policy_errors(path, data, precisions)
    try:
        spec = EndpointSpec.model_validate(data)
    except ValidationError as exc:
        errors += _validation_errors(path, exc, {e.key for e in errors})
        return failed(*errors)
    if errors:
        return failed(*errors)
    return SpecResult(name, path, spec, [], digest)


def endpoint_files(config_dir: Path) -> list[Path]:
    """The endpoint files of a config folder, sorted; `epycd.conf` is not one of them."""
    if not config_dir.is_dir():
        return []
    return sorted(p for p in config_dir.iterdir() if p.suffix == ".toml" and p.is_file())


def load_endpoint(path: Path, *, precisions: list[str]) -> SpecResult:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return SpecResult(
            path.stem,
            path,
            None,
            [InputError(f"unreadable: {exc.strerror}", file=path, fix="check the file")],
        )
    return parse_endpoint(path, raw, precisions=precisions)


def load_endpoints(config_dir: Path, *, precisions: list[str]) -> list[SpecResult]:
    """Every endpoint file of `config_dir`, each validated on its own."""
    return [load_endpoint(path, precisions=precisions) for path in endpoint_files(config_dir)]
