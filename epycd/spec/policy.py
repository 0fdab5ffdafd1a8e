"""What an endpoint file may pass to vLLM and set in its env (docs/architecture.md,
"Endpoint file"): the env and flags the plan owns, what takes over the server, the secrets,
and what loads code, widens what the server reads or sends data out (refused, or allowed
with the approver's consent). `epycd.spec` applies it when it loads a file (`env_errors`,
`extra_args_errors`); the renderer applies it once more to what reaches a unit
(epycd.engines.vllm.render.policy, epycd.engines.vllm.render.gpu).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from epycd.errors import InputError
from epycd.spec.flags import ExtraFlags, flag_name, names

T = TypeVar("T")
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


def _table_flag(flag: str, table: dict[str, T]) -> tuple[str, T] | None:
    """The flag (or family) of `table` that the flag name `flag` names, exactly, within a
    family or abbreviated (`epycd.spec.flags.names`)."""
    for listed, why in table.items():
        if names(flag, listed):
            return listed.replace("*", "..."), why
    return None


def _owned_flag(flag: str) -> tuple[str, str] | None:
    """The owned flag (or family) `flag` names, exactly, within a family or abbreviated."""
    return _table_flag(flag, ARGS_OWNED_BY_PLAN)


def env_reach(name: str) -> Reach | None:
    """The reach of a variable of `LOADS_OR_SENDS_ENV` (or of its address suffixes)."""
    upper = name.upper()
    return LOADS_OR_SENDS_ENV.get(upper) or next(
        (r for suffix, r in LOADS_OR_SENDS_ENV_SUFFIXES.items() if upper.endswith(suffix)), None
    )


def consent_reasons(
    extra_args: ExtraFlags | Sequence[str], env: dict[str, str], *, where: str = "extra_args"
) -> list[str]:
    """The consent the endpoint file's extra_args and env (or the Instinct recipe's args,
    `where` says which) need (`LOADS_OR_SENDS_ARGS`, `LOADS_OR_SENDS_ENV`): one reason per
    flag or variable, naming it and its value. The text goes into the inputs fingerprint:
    a change of its wording asks every approver again."""
    reasons = []
    extra = extra_args if isinstance(extra_args, ExtraFlags) else ExtraFlags.of(extra_args)
    for given in extra.flags:
        found = _table_flag(given.name, LOADS_OR_SENDS_ARGS)
        if found is None or not found[1].consent:
            continue
        flag, reach = found
        value = given.value
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

    One item of extra_args: a long flag (`--flag`, `--flag=value`, `--flag_name`,
    `--flag.key=value`, an abbreviation: `epycd.spec.flags`), a short flag `-x`, or a value."""
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
    name = flag_name(arg)
    if name is None:
        return None
    owned = _owned_flag(name)
    if owned is not None:
        flag, why = owned
        return ArgRefusal(f"{flag}: {why}", "remove it", why.startswith("a secret"))
    reach = _table_flag(name, LOADS_OR_SENDS_ARGS)
    if reach is None or reach[1].consent:
        return None
    return ArgRefusal(f"{reach[0]}: {reach[1].why}", "remove it")


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


def env_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    """The errors of an endpoint file's env table (`data`: the raw TOML of `path`)."""
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


def extra_args_errors(path: Path, data: dict[str, Any]) -> list[InputError]:
    """The errors of an endpoint file's extra_args (`data`: the raw TOML of `path`)."""
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
