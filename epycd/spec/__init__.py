"""Endpoint files: `CONFIG_DIR/NAME.toml`, one vLLM endpoint each (docs/architecture.md,
"Endpoint file").

Loading never stops at a bad file: `load_endpoints` returns one `SpecResult` per file, with
the validated spec or every error found in it. An error names the file and the key and says
what is allowed. Values that could smuggle text into a unit (control characters, newlines)
or fight the plan (env the tuning owns, flags the plan owns, a secret in the env) are errors:
what a file may pass to vLLM and set in its env is `epycd.spec.policy`.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from epycd.engines import DEFAULT_ENGINE, ENGINES
from epycd.engines.base import RUNTIMES, extended
from epycd.errors import InputError
from epycd.listen import DEFAULT_HOST, listen_address
from epycd.names import (
    MODEL_NAME_RULE,
    RESERVED_NAMES,
    is_endpoint_name,
    repo_file_problem,
    revision_problem,
)
from epycd.readfile import RefusedFile, read_head
from epycd.spec.flags import ExtraFlags
from epycd.spec.key_setting import ENGINE_VALUES as ENGINE_NAMES
from epycd.spec.key_setting import EngineKeys, PathText
from epycd.spec.keys import allowed, inapplicable_key_errors
from epycd.spec.policy import env_errors, extra_args_errors
from epycd.text import first_unsafe

HUB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_ENDPOINT_FILE_BYTES = 64 * 1024
MAX_INSTANCES = 64
"""The most instances one endpoint runs (docs/instances.md): more than a 2 x 256-core
host's L3 groups."""

SEE_ENDPOINT_FILE_DOCS = 'see docs/architecture.md, "Endpoint file"'
"""Shown only for a key `allowed()` (epycd.spec.keys) lacks; tests/plan/test_spec.py keeps every
key in it."""


def registered_engine(name: str) -> str:
    """An engine of the registry (`epycd.engines.ENGINES`); any other is refused as a value
    outside a list is."""
    if name not in ENGINE_NAMES:
        raise PydanticCustomError(
            "literal_error",
            "Input should be one of {expected}",
            {"expected": ", ".join(ENGINE_NAMES)},
        )
    return name


EngineName = Annotated[str, AfterValidator(registered_engine)]


MAX_ALIASES = 16
IDLE_STOP_PATTERN = r"^[1-9][0-9]{0,5}(s|m|min|h)$"
"""A duration in systemd's units that the plan takes: seconds, minutes or hours."""
IDLE_STOP_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600}
DEFAULT_IDLE_STOP = "15m"
IDLE_STOP_MIN_S = 10
IDLE_STOP_MAX_S = 7 * 24 * 3600


def idle_stop_seconds(text: str) -> int:
    """A duration that matched `IDLE_STOP_PATTERN`, in seconds."""
    number = re.match(r"[0-9]+", text)
    assert number is not None
    return int(number.group()) * IDLE_STOP_UNITS[text[number.end() :]]


class EndpointSpec(BaseModel):
    """One endpoint file, validated; `None` means "the stack's default"."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model: str | None = None
    revision: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._/-]{1,200}$")
    dtype: str | None = None
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    port: int | Literal["auto"] = "auto"
    host: str = DEFAULT_HOST
    runtime: Literal["auto", "podman", "docker", "host"] = "auto"
    socket: int | Literal["auto"] = "auto"
    image: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
    vllm: PathText | None = None
    served_model_name: str | None = Field(default=None, pattern=r"^[^\s-][^\s]{0,199}$")
    """Not starting with '-': vLLM would read the name as a flag."""
    aliases: list[Annotated[str, Field(pattern=f"^{MODEL_NAME_RULE}$")]] = Field(
        default_factory=list, max_length=MAX_ALIASES
    )
    """More names for the model: the gateway routes them here, and vLLM answers to them."""
    chat_template: PathText | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    hf_token_file: PathText | None = None
    api_key_file: PathText | None = None
    throughput_flags: bool = False
    restart: Literal["no", "on-failure"] = "on-failure"
    """systemd brings a failed or hung endpoint back (docs/healing.md); "no" keeps it down."""
    profile: Literal["balanced", "latency", "throughput"] = "balanced"
    device: Literal["cpu", "instinct"] = "cpu"
    gpus: list[Annotated[int, Field(ge=0)]] | Literal["auto"] = "auto"
    tensor_parallel_size: Literal[1, 2, 4, 8, "auto"] = "auto"
    engine: EngineName = DEFAULT_ENGINE.name
    gguf_file: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._/-]{0,254}$")

    @field_validator("gguf_file")
    @classmethod
    def _gguf_file_inside(cls, value: str | None) -> str | None:
        """A .gguf path inside the repository or folder: the hub's rule for a repository's
        file (`repo_file_problem`: no '.', '..' or empty part, not absolute)."""
        if value is None:
            return value
        if repo_file_problem(value) is not None:
            raise ValueError(f"{value!r} leaves the repository or folder")
        if not value.lower().endswith(".gguf"):
            raise ValueError(f"{value!r} is not a .gguf file")
        return value

    @field_validator("revision")
    @classmethod
    def _revision_is_a_ref(cls, value: str | None) -> str | None:
        """A branch, tag or commit the hub would take (`revision_problem`): never a path
        that huggingface_hub would join to its cache folder and read elsewhere."""
        if value is not None and (problem := revision_problem(value)) is not None:
            raise ValueError(f"{value!r} {problem}")
        return value

    @property
    def extra_flags(self) -> ExtraFlags:
        """extra_args read with the one grammar of `epycd.spec.flags`."""
        return ExtraFlags.of(self.extra_args)

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("the GPU list is empty or names a GPU twice")
        return value

    instances: int | Literal["auto"] = 1
    placement: Literal["socket", "host"] = "socket"
    on_demand: bool = False
    """systemd holds the port; the first request starts the engine (docs/on-demand.md)."""
    idle_stop: str | None = Field(default=None, pattern=IDLE_STOP_PATTERN)
    """How long an on-demand engine runs with no connection: "15m" when not given."""
    min_ready: int | None = Field(default=None, gt=0)

    @property
    def idle_stop_s(self) -> int:
        """The idle time of an on-demand endpoint, in seconds."""
        return idle_stop_seconds(self.idle_stop or DEFAULT_IDLE_STOP)

    @field_validator("instances")
    @classmethod
    def _instances_in_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_INSTANCES:
            raise ValueError(f"instances {value} is outside 1-{MAX_INSTANCES}")
        return value

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

    @field_validator("host")
    @classmethod
    def _host_is_an_address(cls, value: str) -> str:
        return listen_address(value)

    @field_validator("socket")
    @classmethod
    def _socket_not_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"socket {value} is negative")
        return value


@cache
def spec_model() -> type[EndpointSpec]:
    """`EndpointSpec` with each engine's own keys (`EngineKeys.fields`): the type an endpoint
    file is validated as. An engine reads its keys from a spec through its own model."""
    shares = (e.implementation("spec", "KEYS", EngineKeys) for e in ENGINES)
    return extended(EndpointSpec, (s.fields for s in shares if s.fields is not None))


def key_choices(name: str) -> tuple[str, ...]:
    """The values an endpoint file's key of fixed choices takes (`quantize`), read from the
    field that validates it, whichever engine's it is: what a command's option for it
    offers."""
    annotation = spec_model().model_fields[name].annotation
    return tuple(
        value
        for member in (get_args(annotation) or (annotation,))
        if get_origin(member) is Literal
        for value in get_args(member)
    )


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
        bad = first_unsafe(text)
        if bad is not None:
            errors.append(
                InputError(
                    f"contains the control character {bad[1]!r} (newlines and control "
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
            fix = "allowed keys: " + ", ".join(allowed())
        else:
            message = _error_message(error)
            allowed_text = allowed().get(key.split(".")[0].split("[")[0], SEE_ENDPOINT_FILE_DOCS)
            fix = f"allowed: {allowed_text}"
        errors.append(InputError(message, file=path, key=key, fix=fix))
    return errors


def _policy_errors(path: Path, data: dict[str, Any], precisions: list[str]) -> list[InputError]:
    """Values of the right type that the plan cannot accept; read from the raw table so that
    they are reported together with type errors."""
    return (
        _dtype_errors(path, data, precisions)
        + env_errors(path, data)
        + _served_name_errors(path, data)
        + _alias_errors(path, data)
        + extra_args_errors(path, data)
        + inapplicable_key_errors(path, data)
        + _runtime_errors(path, data)
        + _on_demand_errors(path, data)
    )


def _dtype_errors(path: Path, data: dict[str, Any], precisions: list[str]) -> list[InputError]:
    dtype = data.get("dtype")
    if not isinstance(dtype, str) or dtype in precisions:
        return []
    return [
        InputError(
            f"{dtype!r} is not a supported precision",
            file=path,
            key="dtype",
            fix="allowed: " + ", ".join(precisions),
        )
    ]


def _served_name_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    if data.get("served_model_name") != ";":
        return []
    return [
        InputError(
            "a lone ';' would end the command line of the unit",
            file=path,
            key="served_model_name",
            fix="choose another name",
        )
    ]


def _alias_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    """An alias given twice, or the served name again (their type is the model's check)."""
    aliases = data.get("aliases")
    if not isinstance(aliases, list):
        return []
    names = [name for name in aliases if isinstance(name, str)]
    twice = sorted({name for name in names if names.count(name) > 1})
    served = data.get("served_model_name")
    if served in names:
        twice.append(str(served))
    if not twice:
        return []
    return [
        InputError(
            f"{', '.join(map(repr, twice))} is given twice (an alias, or the served name)",
            file=path,
            key="aliases",
            fix="give each name once",
        )
    ]


def _on_demand_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    """What on-demand serving cannot be: a set of instances, an idle time without it, or an
    idle time out of range (their types are the model's check)."""
    on_demand, idle = data.get("on_demand") is True, data.get("idle_stop")
    errors = []
    if on_demand and data.get("instances", 1) != 1:
        errors.append(
            InputError(
                "an on-demand endpoint runs one engine; a set of instances stays up",
                file=path,
                key="on_demand",
                fix="remove instances (one instance), or remove on_demand",
            )
        )
    if idle is not None and not on_demand:
        errors.append(
            InputError(
                "idle_stop is the idle time of an on-demand endpoint",
                file=path,
                key="idle_stop",
                fix="set on_demand = true, or remove idle_stop",
            )
        )
    if isinstance(idle, str) and re.fullmatch(IDLE_STOP_PATTERN, idle):
        seconds = idle_stop_seconds(idle)
        if not IDLE_STOP_MIN_S <= seconds <= IDLE_STOP_MAX_S:
            errors.append(
                InputError(
                    f"{idle!r} is outside 10s-168h",
                    file=path,
                    key="idle_stop",
                    fix='give a duration from "10s" to "168h", such as "15m"',
                )
            )
    return errors


def _runtime_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    """The runtimes an engine or device cannot use (its keys are `epycd.spec.keys`)."""
    if data.get("device") == "instinct" and data.get("runtime") == "host":
        return [
            InputError(
                "an Instinct endpoint runs in a container (the ROCm vLLM image)",
                file=path,
                key="runtime",
                fix='set runtime = "auto", "podman" or "docker"',
            )
        ]
    engine = next((e for e in ENGINES if e.name == data.get("engine", DEFAULT_ENGINE.name)), None)
    runtime = data.get("runtime", "auto")
    if engine is not None and runtime in RUNTIMES and runtime not in engine.runtimes:
        runtimes_text = " or ".join(f'"{r}"' for r in ("auto", *engine.runtimes))
        return [
            InputError(
                f"a {engine.title} endpoint {engine.runtimes_reason}",
                file=path,
                key="runtime",
                fix=f"set runtime = {runtimes_text}",
            )
        ]
    return []


def parse_endpoint(path: Path, raw: bytes, *, precisions: list[str]) -> SpecResult:
    """The endpoint file `path` with content `raw`, validated; never raises."""
    name = path.stem
    digest = hashlib.sha256(raw).hexdigest()

    def failed(*errors: InputError) -> SpecResult:
        return SpecResult(name, path, None, list(errors), digest)

    if not is_endpoint_name(name):
        return failed(
            InputError(
                f"{name!r} is not a valid endpoint name",
                file=path,
                key="file name",
                fix="rename the file: lowercase letters, digits and '-', at most 63, "
                "starting with a letter or digit, ending in .toml",
            )
        )
    if name in RESERVED_NAMES:
        return failed(
            InputError(
                f"{name!r} is reserved: {RESERVED_NAMES[name]}",
                file=path,
                key="file name",
                fix="rename the file",
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
        spec = spec_model().model_validate(data)
    except ValidationError as exc:
        errors += _validation_errors(path, exc, {e.key for e in errors})
        return failed(*errors)
    if errors:
        return failed(*errors)
    return SpecResult(name, path, spec, [], digest)


def endpoint_files(config_dir: Path) -> list[Path]:
    """The endpoint files of a config folder, sorted; `epycd.conf` is not one of them. A
    `NAME.toml` that is not a regular file (a FIFO, a device, a folder) is listed too: it is
    reported as that endpoint's error, not skipped."""
    if not config_dir.is_dir():
        return []
    return sorted(p for p in config_dir.iterdir() if p.suffix == ".toml")


def read_limited(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the regular file `path`: enough to tell a file is too
    large without reading a huge one into memory; never blocks (`epycd.readfile`)."""
    return read_head(path, limit + 1)


def load_endpoint(path: Path, *, precisions: list[str]) -> SpecResult:
    try:
        raw = read_limited(path, MAX_ENDPOINT_FILE_BYTES)
    except RefusedFile as exc:
        refused = InputError(
            exc.strerror or str(exc),
            file=path,
            fix="make it a regular TOML file of the endpoint's settings",
        )
        return SpecResult(path.stem, path, None, [refused])
    except OSError as exc:
        return SpecResult(
            path.stem,
            path,
            None,
            [InputError(f"unreadable: {exc.strerror}", file=path, fix="check the file")],
        )
    if len(raw) > MAX_ENDPOINT_FILE_BYTES:
        too_large = InputError(
            f"is larger than {MAX_ENDPOINT_FILE_BYTES // 1024} KiB, more than an endpoint file "
            "ever needs; not read",
            file=path,
            fix="keep only the endpoint's settings in it (a few lines, see etc/ examples)",
        )
        return SpecResult(path.stem, path, None, [too_large], hashlib.sha256(raw).hexdigest())
    return parse_endpoint(path, raw, precisions=precisions)


def load_endpoints(config_dir: Path, *, precisions: list[str]) -> list[SpecResult]:
    """Every endpoint file of `config_dir`, each validated on its own."""
    return [load_endpoint(path, precisions=precisions) for path in endpoint_files(config_dir)]
