"""The decisions every endpoint shares, CPU or Instinct GPU: what it serves and from where
(`served_model`, `served_fields`: the served name, dtype, the container's bind mounts of a
local model folder and a chat template, the HF cache), and how its service runs and what it
must say (`service_fields`: port and listen address, limits, restart and healing, the start
timeout, the approval check, warnings and the consent it needs, `exposure_reason` among it).

The start timeout is `base_s + per_weights_gib_s x weights GiB` (data/epyc.json): loading
reads the weights from disk and the first request compiles, a minute or two on a CPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TypedDict

from epycd.health import PrimaryEndpoint
from epycd.host.facts import HostFacts
from epycd.listen import is_loopback
from epycd.model.facts import Endpoint, ModelFacts
from epycd.names import unit_name
from epycd.plan import tuning
from epycd.plan.healing import Healing, Restart, healing_for
from epycd.plan.model import BindMount, EngineChoice, HfCacheMount, Runtime
from epycd.plan.prepared import Prepared
from epycd.plan.service.hfcache import host_hf_home
from epycd.plan.service.unit_commands import approval_check_argv
from epycd.sizes import GIB
from epycd.spec import EndpointSpec
from epycd.spec.policy import consent_reasons
from epycd.stack import Stack


def exposure_reason(spec: EndpointSpec, port: int) -> str | None:
    """The consent an endpoint reachable from other machines without an API key needs."""
    if is_loopback(spec.host) or spec.api_key_file is not None:
        return None
    return (
        f"it listens on {spec.host} port {port}, reachable beyond this machine, with no API "
        "key: anyone who reaches the port can use the model (set api_key_file to require a "
        'key, or host = "127.0.0.1" to keep it local)'
    )


def _bind_mounts(
    spec: EndpointSpec, model: str, containerized: bool
) -> tuple[list[BindMount], str]:
    """A container's view of a local model folder and a chat template file, and the model
    argument vLLM gets there (the folder's real path)."""
    mounts: list[BindMount] = []
    model_arg = model
    if model.startswith("/") and containerized:
        real = os.path.realpath(model)
        mounts.append(BindMount(host_path=real, container_path=real))
        model_arg = real
    if spec.chat_template and containerized:
        template = os.path.realpath(spec.chat_template)
        mounts.append(BindMount(host_path=template, container_path=spec.chat_template))
    return mounts, model_arg


def _hf_cache_warnings(hf: HfCacheMount | None, containerized: bool) -> list[str]:
    warnings = []
    if hf is not None and containerized and not os.path.isdir(hf.host_path):
        warnings.append(
            f"the HF cache {hf.host_path} does not exist yet: create it (mkdir -p) before the "
            "container starts, or set HF_HOME to the cache that holds the model"
        )
    if hf is not None and not containerized and host_hf_home(hf) != hf.host_path:
        warnings.append(
            f"the HF cache {hf.host_path} is out of the endpoint's reach (it runs as the user "
            f"epyc-llm, without access to /root and /home): it uses {host_hf_home(hf)}; "
            "set HF_HOME to a cache outside them to share one"
        )
    if hf is not None and hf.on_nfs:
        warnings.append(
            f"the HF cache {hf.host_path} is on a network filesystem: root-squash can deny "
            "the container; use a local disk or export it without root_squash"
        )
    return warnings


def start_timeout_s(stack: Stack, facts: ModelFacts) -> int:
    """TimeoutStartSec: the stack's base and its seconds per GiB of weights."""
    weights_gib = (facts.weights_bytes or 0) / GIB
    return (
        stack.start_timeout.base_s + math.ceil(weights_gib) * stack.start_timeout.per_weights_gib_s
    )


@dataclass(frozen=True)
class ServedModel:
    """What an endpoint serves and how vLLM finds it, by one rule for CPU and Instinct GPU."""

    model: str
    served: str
    """--served-model-name: the file's, else the endpoint's name for a local folder."""
    dtype: str
    model_arg: str
    """vLLM's model argument: a local folder's real path, as a container sees it."""
    mounts: list[BindMount]
    hf: HfCacheMount | None
    """The HF cache; None for a local model folder."""
    containerized: bool


def served_model(
    prepared: Prepared, stack: Stack, hf_cache: HfCacheMount, containerized: bool
) -> ServedModel:
    spec = prepared.spec
    model = spec.model or stack.default_model
    local = model.startswith("/")
    mounts, model_arg = _bind_mounts(spec, model, containerized)
    return ServedModel(
        model=model,
        served=spec.served_model_name or (prepared.result.name if local else model),
        dtype=spec.dtype or stack.default_dtype,
        model_arg=model_arg,
        mounts=mounts,
        hf=hf_cache if not local else None,
        containerized=containerized,
    )


def served_endpoint(endpoint: Endpoint | None) -> PrimaryEndpoint:
    """The path the endpoint serves and its gate asks: an embedder's or a reranker's own, a
    chat model's chat, anything else's raw completions (the engines' model checks refused
    what serves neither)."""
    if endpoint == "chat_completions" or endpoint == "embeddings" or endpoint == "rerank":
        return endpoint
    return "completions"


class ServedFields(TypedDict):
    """The decisions on what an endpoint serves and from where (`served_fields`)."""

    endpoint: str
    unit_name: str
    config_file: str
    model: str
    model_revision: str | None
    served_model_name: str
    model_aliases: list[str]
    model_kind: str
    primary_endpoint: PrimaryEndpoint
    embedding_width: int | None
    runtime: Runtime
    dtype: str
    hf_cache: HfCacheMount | None
    extra_mounts: list[BindMount]
    hf_token_file: str | None
    api_key_file: str | None
    chat_template: str | None
    engine_choice: EngineChoice | None


def served_fields(prepared: Prepared, chosen: ServedModel) -> ServedFields:
    """The decisions of `ServedFields`, the same for every endpoint, CPU or Instinct GPU,
    vLLM or llama.cpp."""
    spec, route, facts = prepared.spec, prepared.route, prepared.facts
    name = prepared.result.name
    primary = served_endpoint(facts.primary_endpoint)
    return ServedFields(
        endpoint=name,
        unit_name=unit_name(name),
        config_file=str(prepared.result.path),
        model=chosen.model,
        model_revision=facts.revision,
        served_model_name=chosen.served,
        model_aliases=list(spec.aliases),
        model_kind=facts.support.kind,
        primary_endpoint=primary,
        embedding_width=facts.embedding_width if primary == "embeddings" else None,
        runtime=route.runtime,
        dtype=chosen.dtype,
        hf_cache=chosen.hf if chosen.containerized else None,
        extra_mounts=chosen.mounts,
        hf_token_file=spec.hf_token_file,
        api_key_file=spec.api_key_file,
        chat_template=spec.chat_template,
        engine_choice=prepared.engine_choice,
    )


@dataclass(frozen=True)
class Placed:
    """Where an endpoint runs, on which port, and what its placement and device add to its
    warnings and to the consent it needs (from a CPU `Placement` or a `GpuPlacement`)."""

    socket: int
    numa_nodes: list[int]
    port: int
    warnings: list[str]
    """The placement's and the sizing's, before the HF cache's."""
    device_warnings: list[str]
    """The device's own, after the HF cache's."""
    confirmation_reasons: list[str] = field(default_factory=list)


class ServiceFields(TypedDict):
    """The decisions on how an endpoint's service runs and what it must say
    (`service_fields`)."""

    socket: int
    numa_nodes: list[int]
    port: int
    host: str
    profile: tuning.Profile
    limit_nofile: int
    limit_memlock: str
    restart: Restart
    healing: Healing
    start_timeout_s: int
    podman_notify_healthy: bool
    product_python: str
    exec_condition: list[list[str]]
    status_file: str
    requires_confirmation: bool
    confirmation_reasons: list[str]
    warnings: list[str]


def service_fields(
    prepared: Prepared,
    chosen: ServedModel,
    placed: Placed,
    host: HostFacts,
    stack: Stack,
    product_python: str,
    status_file: str,
) -> ServiceFields:
    """The decisions of `ServiceFields`, the same for a CPU and an Instinct GPU endpoint:
    the warnings of the route, the model, `placed`, the HF cache, then the device's own."""
    spec, route = prepared.spec, prepared.route
    warnings = [*route.warnings, *prepared.warnings, *placed.warnings]
    warnings += _hf_cache_warnings(chosen.hf, chosen.containerized) + placed.device_warnings
    reasons = [*route.confirmation_reasons, *placed.confirmation_reasons]
    reasons += consent_reasons(spec.extra_args, spec.env)
    if exposed := exposure_reason(spec, placed.port):
        reasons.append(exposed)
    start_s = start_timeout_s(stack, prepared.facts)
    return ServiceFields(
        socket=placed.socket,
        numa_nodes=placed.numa_nodes,
        port=placed.port,
        host=spec.host,
        profile=spec.profile,
        limit_nofile=tuning.LIMIT_NOFILE,
        limit_memlock=tuning.LIMIT_MEMLOCK,
        restart=spec.restart,
        healing=healing_for(spec.restart, start_s, supervised=route.runtime != "podman"),
        start_timeout_s=start_s,
        podman_notify_healthy=route.runtime == "podman" and host.runtimes.podman.notify_healthy,
        product_python=product_python,
        exec_condition=[approval_check_argv(product_python, prepared.result.name)],
        status_file=status_file,
        requires_confirmation=bool(reasons),
        confirmation_reasons=reasons,
        warnings=warnings,
    )
