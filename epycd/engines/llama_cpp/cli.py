"""llama.cpp's endpoints in `epycctl plan`: its server's keys (`llama_server`,
`llama_version`, `gguf_file`, `server_args`), its fit's terms, its slots sharing one KV pool."""

from __future__ import annotations

from typing import Any

from epycd.cli.engine_view import PlanView, Row, instances_json
from epycd.plan.model import (
    CpuServer,
    EndpointDecisions,
    LlamaEndpoint,
    LlamaService,
    LlamaSetEndpoint,
)
from epycd.sizes import gib

PLAN_KEYS = ("llama_server", "llama_version", "gguf_file", "server_args")
"""Its keys of `plan --json` (null for other engines)."""
SET_KEYS = (
    "socket",
    "socket_reason",
    "cpus",
    "numa_nodes",
    "kv_cache_gb",
    "max_model_len",
    "max_num_seqs",
)
"""A set's per-server keys: its members' CPUs and nodes, the socket they share (null across
sockets), its tightest member's context, slots and KV pool."""


def _server(decided: EndpointDecisions | CpuServer) -> LlamaEndpoint:
    assert isinstance(decided, LlamaEndpoint), decided.kind
    return decided


def _service(decided: EndpointDecisions) -> LlamaService:
    assert isinstance(decided, LlamaService), decided.kind
    return decided


class LlamaView(PlanView):
    engine = "llama.cpp"
    plan_keys = PLAN_KEYS

    def json_keys(self, decided: EndpointDecisions, dumped: dict[str, Any]) -> dict[str, Any]:
        if isinstance(decided, LlamaSetEndpoint):
            keys = {key: getattr(decided, key) for key in SET_KEYS}
            return keys | {
                "memory": decided.fit.model_dump(mode="json"),
                "instances": instances_json(decided),
            }
        server = _server(decided)
        return {
            "kv_cache_gb": server.kv_cache_gb,
            "max_model_len": server.max_model_len,
            "max_num_seqs": server.max_num_seqs,
            "memory": dumped["fit"],
        }

    def backend_text(self, decided: EndpointDecisions) -> str:
        return f"llama.cpp {_service(decided).llama_version} (llama-server built for this CPU)"

    def path_text(self, decided: EndpointDecisions) -> str:
        service = _service(decided)
        return f"host llama-server ({service.llama_server}), {service.gguf_file}"

    def endpoint_rows(self, decided: EndpointDecisions) -> list[Row]:
        return list(self.server_rows(_server(decided)))

    def server_rows(self, server: CpuServer) -> tuple[Row, Row, Row]:
        decided = _server(server)
        fit, memory, invocation = decided.fit, decided.fit.memory, decided.invocation
        return (
            (
                "Memory fit",
                f"required {fit.required_gb} GB (server {fit.process_gb}: weights "
                f"{gib(memory.weights_bytes)} + repacked {gib(memory.repacked_bytes)} + KV "
                f"{gib(memory.kv_bytes)} + compute {gib(memory.compute_bytes)}; OS headroom "
                f"{fit.headroom_gb}), available {fit.available_gb} GB on the socket's nodes: "
                f"{'fits' if fit.fits else 'does NOT fit'}",
            ),
            (
                "CPU config",
                f"socket {decided.socket} ({decided.socket_reason}), pinned {decided.cpus}, "
                f"{invocation.threads} threads, memory bound to NUMA nodes "
                f"{','.join(map(str, decided.numa_nodes))}, weights {invocation.load_mode}",
            ),
            (
                "Context",
                f"{invocation.slots} slots sharing one KV pool of {invocation.context} tokens, "
                f"prompt cache {invocation.cache_ram_mib} MiB (profile {decided.profile})",
            ),
        )

    def member_text(self, member: CpuServer) -> tuple[str, str]:
        server = _server(member)
        threads = f"{server.invocation.threads} threads"
        return threads, f"{server.max_num_seqs} slots, context {server.max_model_len}"


VIEW = LlamaView()
