"""The plan's fingerprint: sha256 over the canonical JSON of the rendered units and every
input that shaped them, so that an approval names exactly one plan and drift shows.

Shaping inputs (in the hash):
- the units' text and the folders they go to;
- the endpoint file's bytes (sha256), the stack file's bytes (sha256);
- the model facts the decisions use: id, revision (the commit read), local folder,
  architectures, kind, vLLM version asked, template status, endpoints, weights bytes,
  KV bytes per token, max positions;
- the host's identity and shape: vendor, CPU name, CPUID family/model/stepping, generation,
  Zen arch, AVX-512 / BF16, sockets, cores, threads, per socket its CPU lists, NUMA nodes and
  NPS, per node its CPUs and MemTotal in whole GiB;
- decisions that the units do not spell out but approval relies on: backend, model kind,
  primary endpoint, the consent reasons.

Volatile figures are left out so that two runs on an unchanged host agree: busy %, available
memory, warnings, runtime versions. They still move the fingerprint when they change a unit
(a different socket chosen under load, a KV pool cut by free memory), which is drift.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from epycd.host.facts import HostFacts
from epycd.model.facts import ModelFacts
from epycd.plan.endpoint import EndpointDecisions
from epycd.sizes import GIB


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def shaping_host_facts(host: HostFacts) -> dict[str, Any]:
    return {
        "vendor": host.vendor,
        "cpu_model": host.cpu_model,
        "cpu_family": host.cpu_family,
        "cpu_model_number": host.cpu_model_number,
        "cpu_stepping": host.cpu_stepping,
        "epyc_generation": host.epyc_generation,
        "zen_arch": host.zen_arch,
        "avx512": host.avx512,
        "avx512_bf16": host.avx512_bf16,
        "sockets": host.sockets,
        "physical_cores": host.physical_cores,
        "logical_cores": host.logical_cores,
        "threads_per_core": host.threads_per_core,
        "socket_topology": [
            {
                "socket": sock.socket,
                "physical_cpus": sock.physical_cpus,
                "logical_cpus": sock.logical_cpus,
                "numa_nodes": sock.numa_nodes,
                "nps": sock.nps,
            }
            for sock in host.socket_topology
        ],
        "nodes": [
            {
                "node": node.node,
                "cpus": node.cpus,
                "memory_total_gib": node.memory_total_bytes // GIB,
            }
            for node in host.nodes
        ],
    }


def shaping_model_facts(facts: ModelFacts) -> dict[str, Any]:
    return {
        "model": facts.model,
        "revision": facts.revision,
        "local_path": facts.local_path,
        "architectures": facts.architectures,
        "kind": facts.support.kind,
        "supported": facts.support.supported,
        "vllm_version": facts.support.vllm_version,
        "chat_template": facts.chat_template.status,
        "chat_template_names": facts.chat_template.names,
        "primary_endpoint": facts.primary_endpoint,
        "supported_endpoints": facts.supported_endpoints,
        "weights_bytes": facts.weights_bytes,
        "kv_bytes_per_token": facts.kv_bytes_per_token,
        "max_position_embeddings": facts.max_position_embeddings,
        **({} if facts.max_input_tokens is None else {"max_input_tokens": facts.max_input_tokens}),
    }


def shaping_decisions(decisions: EndpointDecisions) -> dict[str, Any]:
    return {
        "backend": decisions.backend_name,
        "model_kind": decisions.model_kind,
        "primary_endpoint": decisions.primary_endpoint,
        "requires_confirmation": decisions.requires_confirmation,
        "confirmation_reasons": decisions.confirmation_reasons,
    }


def fingerprint_inputs(
    *,
    units: Mapping[str, str],
    unit_dirs: Mapping[str, str],
    spec_sha256: str,
    stack_sha256: str,
    model: ModelFacts,
    host: HostFacts,
    decisions: EndpointDecisions,
) -> dict[str, Any]:
    inputs = {
        "units": dict(units),
        "unit_dirs": dict(unit_dirs),
        "endpoint_file_sha256": spec_sha256,
        "stack_sha256": stack_sha256,
        "model": shaping_model_facts(model),
        "host": shaping_host_facts(host),
        "decisions": shaping_decisions(decisions),
    }
    if decisions.gpus_held:
        inputs["gpus"] = shaping_gpu_facts(host)
    return inputs


def shaping_gpu_facts(host: HostFacts) -> dict[str, Any]:
    """An Instinct endpoint's drift: a GPU gone or added, another gfx, VRAM or NUMA node, and
    the recipe data it was planned with."""
    from epycd.model.instinct import shipped_gpus, shipped_recipes

    return {
        "gpus": [
            [gpu.index, gpu.gfx_version, int(gpu.vram_gb), gpu.numa_node, gpu.pci]
            for gpu in host.gpus
        ],
        "data_sha256": [shipped_gpus().content_sha256, shipped_recipes().content_sha256],
    }


def fingerprint(inputs: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(inputs).encode("utf-8")).hexdigest()


def inputs_fingerprint(inputs: Mapping[str, Any]) -> str:
    """The hash of what drift means: the endpoint file, data/, the model, the host's shape.

    Units are left out because they also carry figures read at plan time (the socket chosen
    under load, a KV pool cut by free memory), and so are the nodes' memory sizes, which grow
    on hosts that initialise memory lazily: a re-plan on an unchanged host may render other
    units, but the approved ones stay right for it. A host whose memory shrank below the plan
    is caught by the boot-time approval check instead.
    """
    stable = {key: value for key, value in inputs.items() if key not in ("units", "unit_dirs")}
    host = dict(stable["host"])
    host["nodes"] = [
        {key: value for key, value in node.items() if key != "memory_total_gib"}
        for node in host["nodes"]
    ]
    stable["host"] = host
    return fingerprint(stable)
