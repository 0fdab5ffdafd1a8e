"""The endpoint file's keys, one row each (`KeySetting`): what the key takes, the engines
and devices it applies to, what it is for, and the fix where it does not apply.

`EndpointSpec` (epycd.spec) holds each key's type and default; everything else about a key
is its row here. From the rows come: the text of the error for a wrong value (`allowed`),
the errors for a key that does not apply to the file's engine or device
(`inapplicable_key_errors`), and the table of keys in docs/admin.md (`keys_markdown`;
`python -m epycd.spec` prints it, tests/plan/test_spec_keys.py keeps the two equal).
A new key is a field of `EndpointSpec` and a row here. An engine's own keys, and the fixes
for the shared keys it does not take, are its `EngineKeys` (`KEYS` in its package's
`spec.py`); `keys()` puts them in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from epycd import engines
from epycd.errors import InputError
from epycd.spec.key_setting import (
    AUTO_ENGINE,
    CPU_ONLY,
    DEVICES,
    ENGINE_VALUES,
    ENGINES,
    INSTINCT_ONLY,
    EngineKeys,
    KeySetting,
)
from epycd.spec.policy import ENV_TUNABLE_TEXT

__all__ = ["DEVICES", "ENGINES", "KeySetting", "allowed", "inapplicable_key_errors", "keys"]

ENGINE_TITLE = {e.name: e.title for e in engines.ENGINES} | {AUTO_ENGINE: 'engine = "auto"'}
DEVICE_TITLE = {"cpu": "CPU", "instinct": "Instinct"}


VLLM_ONLY = ("vllm",)
AUTO = ("auto",)


def _engine_values() -> str:
    """The registered engines as `engine` takes them, the default first, each with what it
    serves, and "auto"."""
    named = [
        f'"{name}" ({"the default: " if i == 0 else ""}{engines.engine_named(name).serves})'
        for i, name in enumerate(ENGINES)
    ]
    return " or ".join([*named, f'"{AUTO_ENGINE}" (the plan chooses, docs/tuning.md rule 12)'])


def _engine_doc() -> str:
    names = [f'`"{name}"`' + (" (the default)" if i == 0 else "") for i, name in enumerate(ENGINES)]
    auto = f'`"{AUTO_ENGINE}"` (the plan chooses by the profile and the model; docs/conversion.md)'
    return " or ".join([*names, auto]) + " ([Which engine](#which-engine))"


SHARED_KEYS: tuple[KeySetting, ...] = (
    KeySetting(
        "model",
        "a Hugging Face id like 'Qwen/Qwen3-0.6B' or an absolute path to a model folder",
        "a Hugging Face id (`Qwen/Qwen3-0.6B`) or an absolute path to a model folder or a "
        "`.gguf` file",
    ),
    KeySetting(
        "revision",
        "a branch, tag or commit: letters, digits, '.', '_', '-', '/'; no '..', no leading, "
        "trailing or doubled '/' (e.g. main, v1.0, refs/pr/1, or 40 hex digits)",
        "a branch, tag or commit of the hub repository",
    ),
    KeySetting(
        "engine",
        _engine_values(),
        _engine_doc(),
    ),
    KeySetting(
        "dtype",
        "one of the stack's precisions",
        "`bfloat16` (the default), `float16` or `float32`",
        engines=VLLM_ONLY,
    ),
    KeySetting(
        "max_model_len",
        "a positive integer (tokens)",
        "the context length, capped to the model's own maximum",
    ),
    KeySetting(
        "max_num_seqs",
        "a positive integer (concurrent sequences)",
        "concurrent sequences (default: the profile's, cut to what fits the memory)",
    ),
    KeySetting(
        "profile",
        '"balanced" (default), "latency" or "throughput" (docs/tuning.md)',
        '`"balanced"` (the default), `"latency"` or `"throughput"` (docs/tuning.md)',
    ),
    KeySetting(
        "port",
        'an integer 1-65535 or "auto"',
        'a number, or `"auto"` (the default): the first free port from 8000',
    ),
    KeySetting(
        "host",
        '"127.0.0.1" (the default), "0.0.0.0", "::" or another IP address of this host',
        '`"127.0.0.1"` (the default), `"0.0.0.0"`, `"::"` or one address of this host',
    ),
    KeySetting(
        "api_key_file",
        "an absolute path to a root-only file holding the endpoint's API key",
        "a root-only file (chmod 600) holding the endpoint's API key",
    ),
    KeySetting(
        "hf_token_file",
        "an absolute path to a root-only file holding the token",
        "a root-only file (chmod 600) holding the HF token",
    ),
    KeySetting(
        "runtime",
        '"auto", "podman", "docker" or "host"',
        '`"auto"` (podman with Quadlet, else docker, else a host vLLM), `"podman"`, '
        '`"docker"`, `"host"`',
    ),
    KeySetting(
        "vllm",
        "an absolute path to the vllm executable of a venv or conda env",
        "the `vllm` executable of a venv or conda env",
        engines=VLLM_ONLY,
        devices=CPU_ONLY,
        fixes={
            "instinct": "an Instinct endpoint runs the ROCm vLLM image (podman or docker)",
        },
    ),
    KeySetting(
        "image",
        "a container image reference like 'repo/name:tag'",
        "a container image",
        engines=VLLM_ONLY,
    ),
    KeySetting(
        "socket",
        '"auto" or a socket number (0, 1, ...)',
        '`"auto"` (an idle socket) or a socket number',
        devices=CPU_ONLY,
        harmless=AUTO,
        fixes={"instinct": 'the GPUs decide the CPUs: leave socket = "auto"'},
    ),
    KeySetting(
        "served_model_name",
        "a name without spaces or control characters, not starting with '-'",
        "the name clients send as `model` (default: the model id)",
    ),
    KeySetting(
        "aliases",
        "a list of at most 16 names, each given once: letters, digits and _ . : / @ + -, at "
        "most 200, starting with a letter or digit",
        'more names clients may send as `model` (`["gpt-4o-mini"]`): the gateway routes '
        "them to this endpoint, and vLLM answers to them",
    ),
    KeySetting(
        "chat_template",
        "an absolute path to a chat template file",
        "an absolute path to a chat template file (Jinja), for a model whose files have none "
        "or to replace theirs: vLLM's `--chat-template`, llama-server's `--chat-template-file`",
    ),
    KeySetting(
        "restart",
        '"on-failure" (the default) or "no"',
        '`"on-failure"` (the default) or `"no"` (docs/healing.md)',
    ),
    KeySetting(
        "extra_args",
        "a list of strings: long flags (--flag or --flag=value) the plan does not own, and "
        "their values",
        "vLLM's own flags, within what the plan leaves open "
        "([Security defaults](#security-defaults))",
        engines=VLLM_ONLY,
        harmless=([],),
    ),
    KeySetting(
        "env",
        'a table of NAME = "value" strings; NAME like [A-Za-z_][A-Za-z0-9_]*, one of '
        + ENV_TUNABLE_TEXT,
        "vLLM's environment, within what the plan leaves open "
        "([Security defaults](#security-defaults))",
        engines=VLLM_ONLY,
        harmless=({},),
    ),
    KeySetting(
        "throughput_flags",
        "true or false",
        "zentorch's throughput set of vLLM flags (docs/tuning.md)",
        engines=VLLM_ONLY,
        devices=CPU_ONLY,
        harmless=(False,),
        fixes={
            "instinct": "zentorch's throughput set is for the CPU path",
        },
    ),
    KeySetting(
        "instances",
        "1 (the default), a number of instances (servers of its engine) behind one balancer, "
        'or "auto" (docs/instances.md)',
        "several instances behind one balancer (docs/instances.md)",
        devices=CPU_ONLY,
        harmless=(1,),
        fixes={
            "instinct": "remove instances: instance sets are CPU endpoints; a GPU endpoint "
            "grows with gpus and tensor_parallel_size"
        },
    ),
    KeySetting(
        "placement",
        '"socket" (the default: the instances share the endpoint\'s socket) or "host" (every '
        "socket no other endpoint holds)",
        "where a set's instances go: its socket, or the whole host (docs/instances.md)",
        devices=CPU_ONLY,
        harmless=("socket",),
        fixes={
            "instinct": "remove placement: instance sets are CPU endpoints; a GPU endpoint "
            "grows with gpus and tensor_parallel_size"
        },
    ),
    KeySetting(
        "min_ready",
        "a positive integer, at most the instance count: how many instances must pass the "
        "health gate for the endpoint to be ready (default: all)",
        "how many of a set's instances must be ready (docs/instances.md)",
        devices=CPU_ONLY,
        harmless=(1,),
        fixes={
            "instinct": "remove min_ready: instance sets are CPU endpoints; a GPU endpoint "
            "grows with gpus and tensor_parallel_size"
        },
    ),
    KeySetting(
        "on_demand",
        "true or false (the default): systemd holds the port and the first request starts "
        "the engine",
        "start on the first request, stop when idle; on-demand endpoints may share a socket, "
        "one running at a time (docs/on-demand.md)",
        devices=CPU_ONLY,
        harmless=(False,),
        fixes={"instinct": "remove on_demand: an Instinct endpoint holds its GPUs and stays up"},
    ),
    KeySetting(
        "idle_stop",
        'a duration from "10s" to "168h" in s, m, min or h (default "15m"), with on_demand',
        "how long an on-demand engine runs with no connection before it stops (docs/on-demand.md)",
        devices=CPU_ONLY,
        fixes={"instinct": "remove idle_stop: an Instinct endpoint holds its GPUs and stays up"},
    ),
    KeySetting(
        "device",
        '"cpu" (the default) or "instinct" (AMD Instinct GPUs, docs/instinct.md)',
        '`"cpu"` (the default) or `"instinct"`: AMD Instinct GPUs (docs/instinct.md)',
        engines=VLLM_ONLY,
        harmless=("cpu",),
    ),
    KeySetting(
        "gpus",
        '"auto" or a list of GPU indices as `epycctl detect` shows them, e.g. [0, 1]',
        'Instinct: the GPUs, or `"auto"`',
        engines=VLLM_ONLY,
        devices=INSTINCT_ONLY,
    ),
    KeySetting(
        "tensor_parallel_size",
        '"auto" or 1, 2, 4 or 8 (GPUs one instance spans)',
        "Instinct: the GPUs one instance spans",
        engines=VLLM_ONLY,
        devices=INSTINCT_ONLY,
    ),
)


@cache
def keys() -> tuple[KeySetting, ...]:
    """Every key's row: the shared keys with each engine's own after `engine`, and each
    engine's fixes for the shared keys it does not take. Put together on first use, so that
    an engine's `spec.py` may import this package."""
    shares = {
        engine.name: engine.implementation("spec", "KEYS", EngineKeys) for engine in engines.ENGINES
    }
    rows: list[KeySetting] = []
    for row in SHARED_KEYS:
        rows.append(_with_refusals(row, shares))
        if row.name == "engine":
            rows += [own for share in shares.values() for own in share.own]
    return tuple(rows)


def _with_refusals(row: KeySetting, shares: Mapping[str, EngineKeys]) -> KeySetting:
    refusing = {
        name: share.refused[row.name] for name, share in shares.items() if row.name in share.refused
    }
    if not refusing:
        return row
    return dataclasses.replace(
        row,
        engines=tuple(e for e in row.engines if e not in refusing),
        fixes={**row.fixes, **refusing},
    )


def allowed() -> dict[str, str]:
    """Key -> what it takes: the fix of the error for a wrong value."""
    return {row.name: row.allowed for row in keys()}


def _title(engine: str, device: str, row: KeySetting) -> str:
    """`a llama.cpp endpoint`, `an Instinct endpoint`: where `row` does not apply."""
    title = (
        ENGINE_TITLE.get(engine, engine)
        if engine not in row.engines
        else DEVICE_TITLE.get(device, device)
    )
    article = "an" if title[:1].lower() in "aeiou" else "a"
    return f"{article} {title} endpoint"


def inapplicable_key_errors(path: Path, data: Mapping[str, Any]) -> list[InputError]:
    """An error for each key the file sets that does not apply to its engine or device (a
    value the row calls harmless aside), naming the key and the fix."""
    engine, device = data.get("engine", ENGINES[0]), data.get("device", DEVICES[0])
    if engine not in ENGINE_VALUES or device not in DEVICES:
        return []  # a wrong engine or device is the type check's error
    return [
        InputError(
            f"{row.name} does not apply to {_title(engine, device, row)}",
            file=path,
            key=row.name,
            fix=row.fix_for(engine, device),
        )
        for row in keys()
        if row.name in data
        and not row.applies(engine, device)
        and not any(_same(data[row.name], value) for value in row.harmless)
    ]


def _same(value: object, harmless: object) -> bool:
    """Equal and of the same type: `1` is not `true`, `0` is not `false`."""
    return type(value) is type(harmless) and value == harmless


def keys_markdown() -> str:
    """docs/admin.md's table of keys: each key, what it takes, where it applies."""
    lines = ["| key | what it takes | applies to |", "|-----|---------------|------------|"]
    for row in keys():
        lines.append(f"| `{row.name}` | {row.doc} | {_where(row)} |")
    return "\n".join(lines) + "\n"


def _where(row: KeySetting) -> str:
    engines = "every engine" if row.engines == ENGINES else ", ".join(row.engines)
    devices = (
        "" if row.devices == DEVICES else " on " + ", ".join(DEVICE_TITLE[d] for d in row.devices)
    )
    return engines + devices
