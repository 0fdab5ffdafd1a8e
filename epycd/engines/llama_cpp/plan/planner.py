"""llama.cpp's planner: llama-server on the host (`route`), the GGUF model check
(`check_llama_model`), the memory fit of one process (`decide.llama_fit`) and one server's
decisions (`decide.decide_llama`)."""

from __future__ import annotations

from pathlib import Path

from epycd.engines.llama_cpp.host import probe_llama_server
from epycd.engines.llama_cpp.plan.decide import decide_llama, llama_fit
from epycd.engines.llama_cpp.plan.model import LlamaEndpoint, LlamaService, LlamaSetEndpoint
from epycd.engines.llama_cpp.plan.route import LlamaProber, llama_route, with_llama_runtime
from epycd.engines.llama_cpp.settings import LlamaSettings
from epycd.errors import Refusal
from epycd.host.facts import HostFacts
from epycd.model.facts import ModelFacts
from epycd.plan.alloc import Placement
from epycd.plan.model import CpuServer
from epycd.plan.planner import EnginePlanner
from epycd.plan.prepared import Prepared, Sources
from epycd.plan.secrets import check_api_key, read_token
from epycd.settings import Settings
from epycd.sizes import gib
from epycd.spec import SpecResult
from epycd.stack import Stack


def check_llama_model(facts: ModelFacts, file: Path) -> list[str]:
    """Refuse what llama.cpp cannot serve on a chat/completions endpoint; return warnings."""
    llama = next((e for e in facts.engines if e.engine == "llama.cpp"), None)
    if facts.format != "gguf" or facts.gguf is None or llama is None:
        raise Refusal(
            f"{facts.model} is not a GGUF file: llama.cpp endpoints serve GGUF models",
            file=file,
            key="model",
            fix="give the absolute path of a .gguf file, or a hub repository or folder with "
            'gguf_file = its file; or serve this model with engine = "vllm"',
        )
    if not llama.supported:
        raise Refusal(llama.reason, file=file, key="model", fix="choose a text-generation GGUF")
    return list(facts.warnings)


class LlamaPlanner(EnginePlanner):
    engine = "llama.cpp"
    set_type = LlamaSetEndpoint
    service_type = LlamaService

    def __init__(self, probe: LlamaProber = probe_llama_server) -> None:
        self.probe = probe

    def with_runtime(
        self, host: HostFacts, specs: list[SpecResult], settings: Settings, sources: Sources
    ) -> HostFacts:
        return with_llama_runtime(
            host, LlamaSettings.of(settings).llama_runtime_dir, specs, self.probe
        )

    def prepare(
        self,
        result: SpecResult,
        host: HostFacts,
        stack: Stack,
        sources: Sources,
        secret_group: int | None,
    ) -> Prepared:
        """Its llama-server, its key and token, its GGUF file read."""
        spec = result.spec
        assert spec is not None
        file = result.path
        route = llama_route(spec, host, file, self.probe)
        check_api_key(spec, file, secret_group)
        facts = sources.inspect(
            spec.model or stack.default_model,
            revision=spec.revision,
            token=read_token(spec, file, secret_group),
            gguf_file=spec.gguf_file,
        )
        return Prepared(result, spec, route, facts, check_llama_model(facts, file))

    def fits(
        self,
        prepared: Prepared,
        host: HostFacts,
        stack: Stack,
        placement: Placement,
        memory_share: float,
    ) -> bool:
        assert prepared.facts.gguf is not None, "checked by check_llama_model"
        return llama_fit(prepared, prepared.facts.gguf, host, placement, memory_share)[0].fits

    decide = staticmethod(decide_llama)

    def unfit(self, prepared: Prepared, server: CpuServer) -> Refusal:
        assert isinstance(server, LlamaEndpoint)
        fit, memory = server.fit, server.fit.memory
        return Refusal(
            f"does not fit: {fit.required_gb} GiB needed (llama-server {fit.process_gb}: "
            f"weights {gib(memory.weights_bytes + memory.repacked_bytes)} + KV "
            f"{gib(memory.kv_bytes)} of {fit.context} tokens shared by {fit.slots} slots + "
            f"compute {gib(memory.compute_bytes + memory.output_bytes + memory.server_bytes)}; "
            f"OS headroom {fit.headroom_gb}), {fit.available_gb} GiB available on the "
            "socket's NUMA nodes",
            file=prepared.result.path,
            key="max_model_len",
            fix=(
                f"set max_model_len = {fit.suggested_context} or less"
                if fit.suggested_context
                else "serve a smaller quantization of the model, or place it on a larger socket"
            ),
        )


PLANNER = LlamaPlanner()
