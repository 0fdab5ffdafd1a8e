"""The pod's volumes (kube.py): the model (a claim or an emptyDir), /dev/shm, and
the endpoint's chat template file as a ConfigMap, each with the mount vLLM reads it from."""

from __future__ import annotations

import re
from typing import Any

from epycd.engines.vllm.plan.invocation import CHAT_TEMPLATE_FLAG
from epycd.engines.vllm.plan.model import (
    AnyVllmServer,
)
from epycd.errors import InputError
from epycd.names import unit_name
from epycd.plan.endpoint import Endpoint
from epycd.plan.model import HfCacheMount
from epycd.readfile import MIB, TEMPLATE_MAX_BYTES, read_text
from epycd.stack import Stack

HF_CACHE_IN_CONTAINER = HfCacheMount.model_fields["container_path"].default
"""Where the images' huggingface_hub (running as root) keeps its cache: the plan's mount."""

SHM_VOLUME = "dshm"

SHM_PATH = "/dev/shm"
"""The units run with --ipc=host (the host's /dev/shm); a pod has its own IPC namespace,
whose /dev/shm is the runtime's 64 MiB default unless a volume is mounted there. A
memory-backed emptyDir there, sized as the stack sizes
an isolated IPC namespace (`Stack.isolated_ipc_shm_size`; the Instinct recipe's docker
flags give no --shm-size, so it is the stack's too). Its pages are charged to the pod's
memory limit, which is not raised for it (a note says so)."""

CHAT_TEMPLATE = "chat-template"
"""The ConfigMap's name suffix (`epyc-llm-NAME-chat-template`) and its volume's name."""

CHAT_TEMPLATE_KEY = "chat-template.jinja"
"""The ConfigMap's key: mounted by `subPath` at `--chat-template`'s own path, so vLLM opens
the path it is given (its name does not matter to vLLM, which reads whatever file it is)."""

CONFIG_MAP_MAX_BYTES = 1 * MIB
"""The API server refuses a ConfigMap whose data passes 1 MiB."""

TEMPLATE_CAP = min(TEMPLATE_MAX_BYTES, CONFIG_MAP_MAX_BYTES)

SHM_UNITS = {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}
"""docker's and podman's --shm-size units (powers of 1024) as Kubernetes quantity suffixes."""


def model_mount(
    decisions: Endpoint,
    process: AnyVllmServer,
    model_volume: str | None,
) -> tuple[str, bool]:
    """(where the model volume is mounted, read-only?): a local folder at the path vLLM is
    given, a hub id's HF cache at the images' cache folder."""
    model_arg = process.invocation.model_arg if process.invocation else process.vllm_args[0]
    if model_arg.startswith("/"):
        if model_volume is None:
            raise InputError(
                f"{decisions.endpoint} serves the local folder {decisions.model}, which a pod "
                "does not have",
                file=decisions.config_file,
                key="model",
                fix="copy the folder into a PersistentVolumeClaim and give it with "
                "--model-volume CLAIM",
            )
        return model_arg, True
    return HF_CACHE_IN_CONTAINER, False


def pod_volumes(
    decisions: Endpoint,
    process: AnyVllmServer,
    stack: Stack,
    model_volume: str | None,
) -> list[dict[str, Any]]:
    _, read_only = model_mount(decisions, process, model_volume)
    if model_volume is None:
        volumes: list[dict[str, Any]] = [{"name": "model", "emptyDir": {}}]
    else:
        claim = {"claimName": model_volume, "readOnly": read_only}
        volumes = [{"name": "model", "persistentVolumeClaim": claim}]
    shm = {"medium": "Memory", "sizeLimit": shm_quantity(stack.isolated_ipc_shm_size)}
    return [*volumes, {"name": SHM_VOLUME, "emptyDir": shm}]


def shm_quantity(size: str) -> str:
    """A --shm-size (`16g`) as a Kubernetes quantity (`16Gi`)."""
    found = re.fullmatch(r"(\d+)([bkmg]?)", size.strip().lower())
    if found is None:
        raise ValueError(f"isolated_ipc_shm_size {size!r} of the stack is not a --shm-size")
    return found[1] + SHM_UNITS[found[2]]


def config_map_name(process: AnyVllmServer) -> str:
    """`epyc-llm-NAME-chat-template`: the endpoint's (a set's members share it)."""
    return f"{unit_name(process.endpoint)}-{CHAT_TEMPLATE}"


def template_in_container(decisions: Endpoint, process: AnyVllmServer) -> str:
    """The path `--chat-template` gives vLLM (the endpoint file's, where the units mount the
    file)."""
    args = process.vllm_args
    if CHAT_TEMPLATE_FLAG in args[:-1]:
        return args[args.index(CHAT_TEMPLATE_FLAG) + 1]
    return str(decisions.chat_template)


def chat_template_mount(decisions: Endpoint, process: AnyVllmServer) -> dict[str, Any]:
    return {
        "name": CHAT_TEMPLATE,
        "mountPath": template_in_container(decisions, process),
        "subPath": CHAT_TEMPLATE_KEY,
        "readOnly": True,
    }


def chat_template_map(
    decisions: Endpoint,
    process: AnyVllmServer,
    labels: dict[str, str],
    notes: list[str],
) -> dict[str, Any] | None:
    """The ConfigMap holding the endpoint's chat_template file (read now, as the units'
    containers read it at each start), or None without a chat_template."""
    path = decisions.chat_template
    if not path:
        return None
    fix = (
        f"make {path} a readable regular UTF-8 file of at most {TEMPLATE_CAP // MIB} MiB (a "
        "ConfigMap's limit), or remove chat_template, then export again"
    )
    try:
        text = read_text(path, TEMPLATE_CAP)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror or str(exc) if isinstance(exc, OSError) else "not UTF-8 text"
        raise InputError(
            f"chat_template file {path} cannot be read: {reason}",
            file=decisions.config_file,
            key="chat_template",
            fix=fix,
        ) from None
    if not text.strip():
        raise InputError(
            f"chat_template file {path} is empty",
            file=decisions.config_file,
            key="chat_template",
            fix=fix,
        )
    name = config_map_name(process)
    notes.append(
        f"the chat template {path} is copied into the ConfigMap {name} (key "
        f"{CHAT_TEMPLATE_KEY}, mounted read-only at {template_in_container(decisions, process)}"
        "): export again after changing the file"
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {CHAT_TEMPLATE_KEY: text},
    }
