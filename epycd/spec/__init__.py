"""Endpoint files: `CONFIG_DIR/NAME.toml`, one vLLM endpoint each (docs/architecture.md,
"Endpoint file").

Loading never stops at a bad file: `load_endpoints` returns one `SpecResult` per file, with
the validated spec or every error found in it. An error names the file and the key and says
what is allowed. Values that could smuggle text into a unit (control characters, newlines)
or fight the plan (env the tuning owns, flags the plan owns, a secret in the env) are errors.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from epycd.errors import InputError
from epycd.listen import DEFAULT_HOST, listen_address
from epycd.names import is_endpoint_name
from epycd.readfile import RefusedFile, read_head
from epycd.text import first_unsafe

T = TypeVar("T")
HUB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_ENDPOINT_FILE_BYTES = 64 * 1024
MAX_INSTANCES = 64
"""The most vLLM instances one endpoint runs (docs/instances.md): more than a 2 x 256-core
host's L3 groups."""
ENV_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ENV_OWNED_BY_PLAN: dict[str, str] = {
    "OMP_NUM_THREADS": "never set: vLLM derives it from the bind list",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "never set: vLLM's own default applies",
    "VLLM_CPU_OMP_THREADS_BIND": "set by the plan: the instance's physical cores but the "
    "front end's (docs/tuning.md rule 1)",
    "VLLM_CPU_KVCACHE_SPACE": "set by the plan from max_num_seqs, max_model_len and the "
    "nodes' memory (docs/tuning.md rule 3)",
    "HF_TOKEN": "a secret: put it in a root-only file and name it in hf_token_file",
    "HUGGING_FACE_HUB_TOKEN": "a secret: put it in a root-only file and name it in hf_token_file",
    "HF_TOKEN_PATH": "name the root-only token file in hf_token_file",
    "VLLM_API_KEY": "a secret: put it in a root-only file and name it in api_key_file",
    "HF_HOME": "the plan mounts (containers) or sets (host) the HF cache it resolved: set "
    "HF_HOME where epycctl runs, or give model as a local path",
    "TORCHINDUCTOR_FREEZING": "one of the throughput set: use throughput_flags = true",
    "VLLM_USE_AOT_COMPILE": "one of the throughput set: use throughput_flags = true",
    "ZENTORCH_WEIGHT_PREPACK": "one of the throughput set: use throughput_flags = true",
}

ENV_TAKES_OVER: dict[str, str] = {
    "NOTIFY_SOCKET": "systemd's readiness socket belongs to the unit and its supervisor",
    "WATCHDOG_USEC": "systemd's watchdog belongs to the unit and its supervisor",
    "WATCHDOG_PID": "systemd's watchdog belongs to the unit and its supervisor",
    "LD_PRELOAD": "it loads other code into the server",
    "LD_LIBRARY_PATH": "it changes which libraries the server loads",
    "LD_AUDIT": "it loads other code into the server",
    "PATH": "it changes which programs run",
    "PYTHONPATH": "it changes which Python code the server runs",
    "PYTHONHOME": "it changes which Python runs",
    "PYTHONSTARTUP": "it runs other code",
    "PYTHONUSERBASE": "it changes which Python code the server runs",
    "PYTHONSAFEPATH": "it changes which Python code the server runs",
    "GOMP_CPU_AFFINITY": "the plan pins the threads (VLLM_CPU_OMP_THREADS_BIND)",
    "KMP_AFFINITY": "the plan pins the threads (VLLM_CPU_OMP_THREADS_BIND)",
    "OMP_PROC_BIND": "the plan pins the threads (VLLM_CPU_OMP_THREADS_BIND)",
    "OMP_PLACES": "the plan pins the threads (VLLM_CPU_OMP_THREADS_BIND)",
    "CUDA_VISIBLE_DEVICES": "the endpoint runs on the CPU the plan chose",
    "VLLM_TARGET_DEVICE": "the endpoint runs on the CPU the plan chose",
    "VLLM_PLUGINS": "it loads other code into the server",
    "VLLM_USE_MODELSCOPE": "it fetches the model from elsewhere than the plan checked",
    "VLLM_SERVER_DEV_MODE": "it exposes development endpoints",
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "/health must fail when the engine dies",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "it lets the server unpickle untrusted data",
    "VLLM_ASSETS_CACHE": "it points the server at other files",
    "VLLM_MEDIA_CACHE": "it points the server at other files",
    "VLLM_USE_RUST_FRONTEND": "it replaces the server the health gate checks",
}
"""Never in a unit, whatever the endpoint file says: the renderer refuses them too."""

DATA_PARALLEL = (
    "one instance runs on one socket; vLLM's CPU data parallel is not offered (it bound "
    "every rank to one NUMA node, vLLM issue 47328; docs/instances.md): use instances = N "
    "for several vLLM instances"
)
ENV_TAKES_OVER_PREFIXES: dict[str, str] = {
    "VLLM_DP_": DATA_PARALLEL,
    "VLLM_RAY_": "one instance runs on one socket, without Ray",
}
ENV_TAKES_OVER_SUFFIXES: dict[str, str] = {
    "_PATH": "it points the server at other files or code",
    "_DIR": "it points the server at other files or code",
    "_ROOT": "it points the server at other files or code",
    "_HOME": "it points the server at other files or code",
    "_FOLDER": "it points the server at other files or code",
    "_IP": "the plan decides where the endpoint listens",
    "_HOST": "the plan decides where the endpoint listens",
    "_PORT": "the plan decides where the endpoint listens",
}

ENV_TUNABLE_PREFIXES = ("VLLM_", "TORCHINDUCTOR_", "ZENTORCH_", "ZENDNN_", "ZENDNNL_")
ENV_TUNABLE_NAMES = frozenset(
    {
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "HF_HUB_ETAG_TIMEOUT",
        "TOKENIZERS_PARALLELISM",
        "TORCH_LOGS",
        "PYTHONUNBUFFERED",
        "PYTHONFAULTHANDLER",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "TZ",
        "NO_COLOR",
    }
)
"""The env allow-list. A deny-list of what takes over a process cannot be complete (the
loader, Python, OpenMP, CUDA, Ray... each read their own), so an endpoint file may set only
the knobs that tune vLLM and its CPU libraries (VLLM_*, TORCHINDUCTOR_*, ZENTORCH_*,
ZENDNN_*/ZENDNNL_*) and a few named ones; even among those, what the plan sets, what points
at other files, code or addresses (names ending _PATH, _DIR, _ROOT, _HOME, _FOLDER, _IP,
_HOST, _PORT) and what takes over the process or its readiness (ENV_TAKES_OVER) is refused."""

ENV_TUNABLE_TEXT = (
    "VLLM_*, TORCHINDUCTOR_*, ZENTORCH_*, ZENDNN_*, ZENDNNL_* (except the plan's own and names "
    "ending _PATH, _DIR, _ROOT, _HOME, _FOLDER, _IP, _HOST, _PORT), "
    + ", ".join(sorted(ENV_TUNABLE_NAMES))
)
SECRET_NAME_WORDS = frozenset(
    {"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"}
)
SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,})|://[^/\s:@]+:[^/\s@]+@"
)
"""Hugging Face tokens, OpenAI-style API keys and passwords in URLs (user:pass@host)."""
SECRET_FIX = (
    "a secret never goes in an endpoint file's env or extra_args: put the Hugging Face token "
    "in a root-only file named by hf_token_file, the endpoint's API key in one named by "
    "api_key_file"
)

ARGS_OWNED_BY_PLAN: dict[str, str] = {
    "--device": "vllm serve >= 0.20 rejects it",
    "--device-ids": "the endpoint runs on the CPU the plan chose",
    "--shm-size": "the container runs with --ipc=host",
    "--port": "use the port key",
    "--host": "use the host key",
    "--uds": "the endpoint listens on the host and port keys",
    "--grpc*": "the health gate and the hand-off speak HTTP on the port key",
    "--ssl-*": "the health gate and the hand-off speak plain HTTP on the host and port keys",
    "--api-key": "a secret: put it in a root-only file and name it in api_key_file",
    "--hf-token": "a secret: put it in a root-only file and name it in hf_token_file",
    "--config": "a config file could set any flag the plan owns: write the flags here",
    "--headless": "the endpoint serves its API itself",
    "--api-server-count": "one API server per endpoint; the plan sizes the CPUs",
    "--model": "use the model key",
    "--dtype": "use the dtype key",
    "--max-model-len": "use the max_model_len key",
    "--max-num-seqs": "use the max_num_seqs key",
    "--served-model-name": "use the served_model_name key",
    "--chat-template": "use the chat_template key",
    "--revision": "use the revision key",
    "--download-dir": "the plan mounts (containers) or sets (host) the HF cache",
    "--kv-cache-memory-bytes": "the plan sizes the KV pool",
    "--gpu-memory-utilization": "the plan sizes the KV pool",
    "--numa-bind*": "the plan pins the CPUs and NUMA nodes",
    "--distributed-executor-backend": "one instance runs on one socket",
    "--tensor-parallel-size": "one instance runs on one socket",
    "--pipeline-parallel-size": "one instance runs on one socket",
    "--decode-context-parallel-size": "one instance runs on one socket",
    "--prefill-context-parallel-size": "one instance runs on one socket",
    "--data-parallel-*": DATA_PARALLEL,
    "--dp-*": DATA_PARALLEL,
    "--nnodes": "one instance runs on one socket",
    "--node-rank": "one instance runs on one socket",
    "--master-addr": "one instance runs on one socket",
    "--master-port": "one instance runs on one socket",
}
"""Long flags (and, with `*`, flag families) an endpoint file may not pass. Abbreviations
count: vLLM's parser accepts any unique prefix of a flag (`--dev` is `--device`)."""

SHORT_FLAG_LONG_FORMS: dict[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-O": "--optimization-level",
    "-q": "--quantization",
    "-cc": "--compilation-config",
    "-sc": "--speculative-config",
    "-ac": "--attention-config",
    "-asc": "--api-server-count",
    "-ep": "--enable-expert-parallel",
}
"""Short flags are refused in extra_args: one can alias a flag the plan owns (-tp, -pp,
-dp...) and `-O3` packs its value into the flag, so only long flags are checked; this map
only helps the message name the long form."""
SHORT_FLAG = re.compile(r"-[A-Za-z]")


class Reach(NamedTuple):
    """What a flag or variable of `LOADS_OR_SENDS_ARGS`/`_ENV` does beyond tuning vLLM."""

    consent: bool
    """True: allowed once the approver consents; False: refused."""
    why: str
    """Shown with the flag or variable; `{value}` is its value."""


LOADS_CODE = "it imports Python code named here into the server, code the approval does not cover"
LOADS_OR_SENDS_ARGS: dict[str, Reach] = {
    "--middleware": Reach(False, LOADS_CODE + " (ASGI middleware)"),
    "--worker-cls": Reach(False, LOADS_CODE + " (a worker class)"),
    "--worker-extension-cls": Reach(False, LOADS_CODE + " (a worker extension class)"),
    "--logits-processors": Reach(False, LOADS_CODE + " (logits processor classes)"),
    "--logits-processor-pattern": Reach(
        False, "API clients could name Python classes for the server to import"
    ),
    "--tool-parser-plugin": Reach(False, LOADS_CODE + " (a tool parser file)"),
    "--reasoning-parser-plugin": Reach(False, LOADS_CODE + " (a reasoning parser file)"),
    "--io-processor-plugin": Reach(False, LOADS_CODE + " (an IO processor plugin)"),
    "--log-config-file": Reach(
        False, "a logging config can build any Python object and write files anywhere"
    ),
    "--kv-transfer-config": Reach(
        False, "it connects the engine to other processes by address and can import a module"
    ),
    "--kv-events-config": Reach(False, "it publishes the engine's events to an address"),
    "--ec-transfer-config": Reach(
        False, "it connects the encoder cache to other processes and can import a module"
    ),
    "--trust-remote-code": Reach(
        True, "it runs the model repository's own Python code inside the server"
    ),
    "--otlp-traces-endpoint": Reach(True, "it sends a trace of every request to {value}"),
    "--tool-server": Reach(
        True,
        "it sends the model's tool calls to {value} (`demo`: a web browser and a code interpreter)",
    ),
    "--allowed-local-media-path": Reach(
        True, "API clients may make the server read any file under {value} it can read"
    ),
    "--trust-request-chat-template": Reach(
        True, "API clients may send their own chat template for the server to render"
    ),
    "--enable-log-requests": Reach(
        True, "it writes every prompt to the journal, for whoever reads the journal"
    ),
    "--enable-log-outputs": Reach(
        True, "it writes every response to the journal, for whoever reads the journal"
    ),
}
LOADS_OR_SENDS_ENV: dict[str, Reach] = {
    "VLLM_USAGE_STATS_SERVER": Reach(False, "it sends usage data to another address"),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": Reach(
        False,
        "API clients could make the server load adapters from any path it reads or from the hub",
    ),
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": Reach(
        True, "it writes every response to the journal, for whoever reads the journal"
    ),
}
LOADS_OR_SENDS_ENV_SUFFIXES: dict[str, Reach] = {
    suffix: Reach(False, "it sends data to an address the plan does not check")
    for suffix in ("_URL", "_URI", "_ENDPOINT", "_SERVER", "_SERVERS", "_ADDR", "_ADDRESS")
}
"""One policy for the endpoint file's extra_args and env: what loads code, widens what the
server reads or sends data out is refused (the reason is the error), or allowed only with
the approver's consent, which the plan shows with the flag or variable and its value.

Consent is the plan's own (`consent_reasons` -> `confirmation_reasons`, "Consent needed" in
`plan` and `approve`, given with `approve --accept-unvalidated`, recorded in the approval
and covered by the fingerprint), as for a stock path or a port open without a key. No
endpoint-file key (`allow = [...]`): a key would be consent by whoever writes the file, and
the person who approves would not be asked. Refused: what names code or addresses the
approval cannot judge (plugins, classes, connectors, logging configs) or hands API clients
a loader. With consent: what a person can judge from the plan (the model's own code, a
trace or tool server address, a media folder, prompts and responses in the journal).
Flags match as `ARGS_OWNED_BY_PLAN` do: `--flag=value`, `--flag value`, `--flag_name` and
abbreviations; short flags are refused anyway. Not here because the plan already owns them:
`--api-key` (a secret on argv: api_key_file), `--ssl-*`, `--chat-template`,
`--download-dir`, `--uds`; `--root-path` only prefixes the API's URLs behind a proxy."""

SEE_ENDPOINT_FILE_DOCS = 'see docs/architecture.md, "Endpoint file"'
"""Shown only for a key `ALLOWED` lacks; tests/plan/test_spec.py keeps every key in it."""

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
    "served_model_name": "a name without spaces or control characters, not starting with '-'",
    "chat_template": "an absolute path to a chat template file",
    "extra_args": "a list of strings: long flags (--flag or --flag=value) the plan does not "
    "own, and their values",
    "env": 'a table of NAME = "value" strings; NAME like [A-Za-z_][A-Za-z0-9_]*, one of '
    + ENV_TUNABLE_TEXT,
    "hf_token_file": "an absolute path to a root-only file holding the token",
    "api_key_file": "an absolute path to a root-only file holding the endpoint's API key",
    "host": '"127.0.0.1" (the default), "0.0.0.0", "::" or another IP address of this host',
    "throughput_flags": "true or false",
    "restart": '"on-failure" (the default) or "no"',
    "profile": '"balanced" (default), "latency" or "throughput" (docs/tuning.md)',
    "device": '"cpu" (the default) or "instinct" (AMD Instinct GPUs, docs/instinct.md)',
    "gpus": '"auto" or a list of GPU indices as `epycctl detect` shows them, e.g. [0, 1]',
    "tensor_parallel_size": '"auto" or 1, 2, 4 or 8 (GPUs one instance spans)',
    "instances": '1 (the default), a number of vLLM instances behind one balancer, or "auto" '
    "(docs/instances.md)",
    "placement": '"socket" (the default: the instances share the endpoint\'s socket) or "host" '
    "(every socket no other endpoint holds)",
    "min_ready": "a positive integer, at most the instance count: how many instances must "
    "pass the health gate for the endpoint to be ready (default: all)",
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
    host: str = DEFAULT_HOST
    runtime: Literal["auto", "podman", "docker", "host"] = "auto"
    socket: int | Literal["auto"] = "auto"
    image: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
    vllm: PathText | None = None
    served_model_name: str | None = Field(default=None, pattern=r"^[^\s-][^\s]{0,199}$")
    """Not starting with '-': vLLM would read the name as a flag."""
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

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, value: list[int] | str) -> list[int] | str:
        if isinstance(value, list) and (not value or len(set(value)) != len(value)):
            raise ValueError("the GPU list is empty or names a GPU twice")
        return value

    instances: int | Literal["auto"] = 1
    placement: Literal["socket", "host"] = "socket"
    min_ready: int | None = Field(default=None, gt=0)

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
            fix = "allowed keys: " + ", ".join(EndpointSpec.model_fields)
        else:
            message = _error_message(error)
            allowed = ALLOWED.get(key.split(".")[0].split("[")[0], SEE_ENDPOINT_FILE_DOCS)
            fix = f"allowed: {allowed}"
        errors.append(InputError(message, file=path, key=key, fix=fix))
    return errors


def _table_flag(flag: str, table: dict[str, T]) -> tuple[str, T] | None:
    """The flag (or family) of `table` that `flag` names, exactly, within a family or
    abbreviated."""
    for owned, why in table.items():
        stem = owned.removesuffix("*")
        family = owned.endswith("*")
        abbreviated = len(flag) > 3 and stem.startswith(flag)
        if flag == stem or abbreviated or (family and flag.startswith(stem)):
            return owned.replace("*", "..."), why
    return None


def _owned_flag(flag: str) -> tuple[str, str] | None:
    """The owned flag (or family) `flag` names, exactly, within a family or abbreviated."""
    return _table_flag(flag, ARGS_OWNED_BY_PLAN)


def _flag_name(arg: str) -> str:
    """`--flag` of `--flag`, `--flag=value`, `--flag.key=value` or `--flag_name`."""
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def arg_reach(arg: str) -> tuple[str, Reach] | None:
    """The flag of `LOADS_OR_SENDS_ARGS` that the long flag `arg` names, and its reach."""
    if not arg.startswith("--") or arg == "--":
        return None
    return _table_flag(_flag_name(arg), LOADS_OR_SENDS_ARGS)


def env_reach(name: str) -> Reach | None:
    """The reach of a variable of `LOADS_OR_SENDS_ENV` (or of its address suffixes)."""
    upper = name.upper()
    return LOADS_OR_SENDS_ENV.get(upper) or next(
        (r for suffix, r in LOADS_OR_SENDS_ENV_SUFFIXES.items() if upper.endswith(suffix)), None
    )


def consent_reasons(
    extra_args: list[str], env: dict[str, str], *, where: str = "extra_args"
) -> list[str]:
    """The consent the endpoint file's extra_args and env (or the Instinct recipe's args,
    `where` says which) need (`LOADS_OR_SENDS_ARGS`, `LOADS_OR_SENDS_ENV`): one reason per
    flag or variable, naming it and its value."""
    reasons = []
    for index, arg in enumerate(extra_args):
        found = arg_reach(arg)
        if found is None or not found[1].consent:
            continue
        flag, reach = found
        value = arg.split("=", 1)[1] if "=" in arg else None
        following = extra_args[index + 1] if index + 1 < len(extra_args) else None
        if value is None and following is not None and not following.startswith("-"):
            value = following
        shown = flag if value is None else f"{flag} {value}"
        why = reach.why.replace("{value}", value or "(no value)")
        reasons.append(f"{where} {shown}: {why}")
    for name, value in env.items():
        env_found = env_reach(name)
        if env_found is not None and env_found.consent:
            reasons.append(f"env {name}={value}: {env_found.why.replace('{value}', value)}")
    return reasons


class ArgRefusal(NamedTuple):
    why: str
    fix: str
    secret: bool = False


def arg_refusal(arg: str) -> ArgRefusal | None:
    """Why an endpoint file may not pass `arg` to vLLM, or None when it may.

    One item of extra_args: a long flag `--flag` or `--flag=value` (underscores count as
    dashes, `--flag.key` as `--flag`), a short flag `-x`, or a value."""
    if SECRET_VALUE.search(arg):
        return ArgRefusal(
            "it looks like a secret (a token, an API key or a password)", SECRET_FIX, True
        )
    if SHORT_FLAG.match(arg):
        flag = arg.split("=", 1)[0]
        long_form = (
            "--optimization-level" if flag.startswith("-O") else SHORT_FLAG_LONG_FORMS.get(flag)
        )
        return ArgRefusal(
            "a short flag can alias a flag the plan owns; only long flags are checked",
            f"write the long form ({long_form})"
            if long_form
            else "write the long form; a value that starts with '-' joins its flag: --flag=-x",
        )
    if not arg.startswith("--") or arg == "--":
        return None
    owned = _owned_flag(_flag_name(arg))
    if owned is None:
        reach = arg_reach(arg)
        if reach is None or reach[1].consent:
            return None
        return ArgRefusal(f"{reach[0]}: {reach[1].why}", "remove it")
    name, why = owned
    return ArgRefusal(f"{name}: {why}", "remove it", why.startswith("a secret"))


def env_refusal(name: str, value: str) -> tuple[str, str] | None:
    """(why, fix) when an endpoint file may not set `name` to `value`; None when it may."""
    upper = name.upper()
    if upper in ENV_OWNED_BY_PLAN:
        return "the plan owns it", ENV_OWNED_BY_PLAN[upper]
    takes_over = ENV_TAKES_OVER.get(upper) or next(
        (why for prefix, why in ENV_TAKES_OVER_PREFIXES.items() if upper.startswith(prefix)),
        None,
    )
    takes_over = takes_over or next(
        (why for suffix, why in ENV_TAKES_OVER_SUFFIXES.items() if upper.endswith(suffix)), None
    )
    if takes_over:
        return f"it takes over the server: {takes_over}", "remove it; allowed: " + ENV_TUNABLE_TEXT
    if SECRET_NAME_WORDS & set(upper.split("_")) or SECRET_VALUE.search(value):
        return "it looks like a secret (a token, an API key or a password)", SECRET_FIX
    if name not in ENV_TUNABLE_NAMES and not name.startswith(ENV_TUNABLE_PREFIXES):
        return "it is not one of the variables an endpoint may tune", "allowed: " + ENV_TUNABLE_TEXT
    reach = env_reach(name)
    if reach is not None and not reach.consent:
        return f"it loads code or sends data out: {reach.why}", "remove it"
    return None


def _policy_errors(path: Path, data: dict[str, Any], precisions: list[str]) -> list[InputError]:
    """Values of the right type that the plan cannot accept; read from the raw table so that
    they are reported together with type errors."""
    return (
        _dtype_errors(path, data, precisions)
        + _env_errors(path, data)
        + _served_name_errors(path, data)
        + _extra_args_errors(path, data)
        + _device_errors(path, data)
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


def _env_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    errors = []
    env = data.get("env")
    for env_key, value in (env if isinstance(env, dict) else {}).items():
        if not ENV_KEY_PATTERN.fullmatch(env_key):
            errors.append(
                InputError(
                    f"{env_key!r} is not a valid variable name",
                    file=path,
                    key=f"env.{env_key}",
                    fix="allowed: names like [A-Za-z_][A-Za-z0-9_]*",
                )
            )
        elif env_refused := env_refusal(env_key, value if isinstance(value, str) else ""):
            errors.append(
                InputError(
                    f"{env_key} may not be set here: {env_refused[0]}",
                    file=path,
                    key=f"env.{env_key}",
                    fix=env_refused[1],
                )
            )
    return errors


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


def _extra_args_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    errors = []
    args = data.get("extra_args")
    for index, arg in enumerate(args if isinstance(args, list) else []):
        refusal = arg_refusal(arg) if isinstance(arg, str) else None
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
        elif refusal:
            shown = "this value" if refusal.secret else repr(arg)
            errors.append(
                InputError(
                    f"{shown} is not allowed in extra_args ({refusal.why})",
                    file=path,
                    key=f"extra_args[{index}]",
                    fix=refusal.fix,
                )
            )
    return errors


CPU_ONLY_KEYS = {
    "socket": 'the GPUs decide the CPUs: leave socket = "auto"',
    "throughput_flags": "zentorch's throughput set is for the CPU path",
    "vllm": "an Instinct endpoint runs the ROCm vLLM image (podman or docker)",
}


def _device_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    """Keys that belong to one device only (docs/instinct.md)."""
    if data.get("device", "cpu") != "instinct":
        return [
            InputError(
                f"{key} is for Instinct GPU endpoints",
                file=path,
                key=key,
                fix='set device = "instinct", or remove ' + key,
            )
            for key in ("gpus", "tensor_parallel_size")
            if key in data
        ]
    errors = [
        InputError(f"{key} does not apply to an Instinct endpoint", file=path, key=key, fix=why)
        for key, why in CPU_ONLY_KEYS.items()
        if key in data and data[key] not in ("auto", False)
    ]
    errors += [
        InputError(
            f"{key} does not apply to an Instinct endpoint: instance sets are CPU endpoints",
            file=path,
            key=key,
            fix=f"remove {key}; a GPU endpoint grows with gpus and tensor_parallel_size",
        )
        for key in ("instances", "placement", "min_ready")
        if key in data and data[key] not in (1, "socket")
    ]
    if data.get("runtime") == "host":
        errors.append(
            InputError(
                "an Instinct endpoint runs in a container (the ROCm vLLM image)",
                file=path,
                key="runtime",
                fix='set runtime = "auto", "podman" or "docker"',
            )
        )
    return errors


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
