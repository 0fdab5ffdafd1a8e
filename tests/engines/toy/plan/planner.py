"""The toy engine's planner: the model inspected as every engine's is, a fit of its weights
and a GiB per slot, and one server's decisions from the core's shared fields."""

from __future__ import annotations

from typing import Literal

from epycd.errors import Refusal
from epycd.host.facts import HostFacts
from epycd.plan.engines.planner import EnginePlanner
from epycd.plan.model import AnyServer, HfCacheMount
from epycd.plan.placement.alloc import Placement, node_memory
from epycd.plan.prepared import Prepared, Sources
from epycd.plan.route import EngineRoute, refuse_non_epyc
from epycd.plan.service.secrets import check_api_key, read_token
from epycd.plan.service.served import Placed, served_fields, served_model, service_fields
from epycd.sizes import GIB
from epycd.spec import SpecResult
from epycd.stack import Stack
from tests.engines.toy.plan.model import ToyFit, ToyServer

DEFAULT_CONTEXT = 2048
DEFAULT_SLOTS = 2


class ToyRoute(EngineRoute):
    engine: Literal["toy"] = "toy"
    runtime: Literal["host"] = "host"


def toy_fit(prepared: Prepared, host: HostFacts, placement: Placement, share: float) -> ToyFit:
    slots = prepared.spec.max_num_seqs or DEFAULT_SLOTS
    weights = (prepared.facts.weights_bytes or 0) / GIB
    memory = node_memory(host, placement, placement.cpus, share)
    return ToyFit(required_gb=round(weights + slots, 2), available_gb=round(memory.available, 2))


class ToyPlanner(EnginePlanner):
    engine = "toy"

    def prepare(
        self,
        result: SpecResult,
        host: HostFacts,
        stack: Stack,
        sources: Sources,
        secret_group: int | None,
    ) -> Prepared:
        spec = result.spec
        assert spec is not None
        refuse_non_epyc(host)
        check_api_key(spec, result.path, secret_group)
        facts = sources.inspect(
            spec.model or stack.default_model,
            revision=spec.revision,
            token=read_token(spec, result.path, secret_group),
        )
        return Prepared(result, spec, ToyRoute(), facts, list(facts.warnings))

    def fits(
        self,
        prepared: Prepared,
        host: HostFacts,
        stack: Stack,
        placement: Placement,
        memory_share: float,
    ) -> bool:
        return toy_fit(prepared, host, placement, memory_share).fits

    def decide(
        self,
        prepared: Prepared,
        *,
        host: HostFacts,
        stack: Stack,
        placement: Placement,
        port: int,
        hf_cache: HfCacheMount,
        product_python: str,
        status_file: str,
        memory_share: float = 1.0,
    ) -> ToyServer:
        chosen = served_model(prepared, stack, hf_cache, containerized=False)
        placed = Placed(placement.socket, placement.numa_nodes, port, placement.warnings, [])
        context = prepared.spec.max_model_len or DEFAULT_CONTEXT
        slots = prepared.spec.max_num_seqs or DEFAULT_SLOTS
        return ToyServer(
            **served_fields(prepared, chosen),
            **service_fields(prepared, chosen, placed, host, stack, product_python, status_file),
            toy_version="1",
            socket_reason=placement.reason,
            cpus=placement.cpulist,
            env={"TOY_CONTEXT": str(context), "TOY_SLOTS": str(slots)},
            fit=toy_fit(prepared, host, placement, memory_share),
            context=context,
            slots=slots,
            server_args=["-m", "http.server", str(port), "--bind", prepared.spec.host],
        )

    def unfit(self, prepared: Prepared, server: AnyServer) -> Refusal:
        fit = server.cpu_fit
        assert fit is not None, "a toy server is on CPUs"
        return Refusal(
            f"does not fit: {fit.required_gb} GiB needed, {fit.available_gb} GiB available",
            file=prepared.result.path,
            key="max_num_seqs",
            fix=fit.action,
        )


PLANNER = ToyPlanner()
