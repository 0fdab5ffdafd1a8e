"""vLLM's planner: its runtime (a container image, a host vLLM or the embedded runtime,
`route.py`), the model check of a chat or completions endpoint (`check_model`), the memory
fit (`sizing.py`) and one server's decisions (`decide_cpu.py`), in this package. An Instinct
endpoint is vLLM's too: its route is the ROCm image, its tensor-parallel size `gpus.py`'s,
its decisions `decide_gpu.py`'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from epycd.engines.vllm.model.format import FORMAT
from epycd.engines.vllm.plan import decide_cpu
from epycd.engines.vllm.plan.decide_gpu import decide_gpu
from epycd.engines.vllm.plan.gpus import TensorParallelSizer
from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.engines.vllm.plan.route import gpu_route, refuse_not_llm, route_endpoint
from epycd.engines.vllm.plan.sizing import size
from epycd.engines.vllm.plan.tuning import front_end_cores
from epycd.errors import Refusal
from epycd.host.facts import HostFacts, HostVllmFacts
from epycd.model.facts import ModelFacts
from epycd.model.formats import format_named
from epycd.plan.engines.planner import EnginePlanner
from epycd.plan.model import AnyServer, GpuServer
from epycd.plan.placement.alloc import Placement
from epycd.plan.placement.gpu import GpuPlacement, GpuSizer
from epycd.plan.placement.instances import Slot
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import Prepared, Sources
from epycd.plan.route import container_runtime
from epycd.plan.service.secrets import check_api_key, read_token
from epycd.settings import Settings
from epycd.spec import EndpointSpec, SpecResult
from epycd.spec.key_setting import AUTO_ENGINE
from epycd.stack import Stack


def needs_host_vllm(spec: EndpointSpec, host: HostFacts) -> bool:
    if spec.device == "instinct":
        return False
    if spec.runtime == "host":
        return True
    return spec.runtime == "auto" and container_runtime(host.runtimes) is None


def check_model(spec: EndpointSpec, facts: ModelFacts, stack: Stack, file: Path) -> list[str]:
    """Refuse what vLLM cannot serve on an endpoint of its primary path; return warnings."""
    own_format = format_named(facts.format)
    if own_format is not None and own_format is not FORMAT:
        vllm = next(e for e in facts.engines if e.engine == FORMAT.engine)
        raise Refusal(
            vllm.reason,
            file=file,
            key="model",
            fix=f'serve it with engine = "{own_format.engine}", or give a model folder or hub '
            "id with safetensors weights",
        )
    if facts.support.supported is False or not facts.launchable:
        raise Refusal(facts.message or "vLLM cannot serve this model", file=file, key="model")
    if facts.pooling and spec.device == "instinct":
        raise Refusal(
            f"{facts.model} is an {facts.support.kind} model (/v1/{facts.primary_endpoint}): "
            "epyc-llm serves embedding and reranker models on the CPU, Instinct GPUs serve "
            "the recipe's LLMs",
            file=file,
            key="device",
            fix='remove device = "instinct" (or set device = "cpu")',
        )
    if facts.primary_endpoint is None:
        raise Refusal(
            f"{facts.model} is a {facts.support.kind} model: no chat, completions, embeddings "
            "or rerank endpoint",
            file=file,
            key="model",
            fix="choose a text-generation, embedding or reranker model",
        )
    warnings = list(facts.warnings)
    if facts.support.supported is None:
        warnings.append(f"vLLM support is undetermined ({facts.message}); vLLM decides at start")
    family = stack.gated_family(facts.model)
    if spec.hf_token_file is None and (facts.gated or (facts.gated is None and family)):
        text = f"{facts.model} is gated: it needs an HF token and an accepted licence"
        if facts.gated:
            raise Refusal(
                text, file=file, key="hf_token_file", fix="accept the licence and set hf_token_file"
            )
        warnings.append(f"{text} ({family.family if family else 'gated family'}); none given")
    return warnings


class VllmPlanner(EnginePlanner):
    engine = "vllm"

    def with_runtime(
        self, host: HostFacts, specs: list[SpecResult], settings: Settings, sources: Sources
    ) -> HostFacts:
        """`runtime = "auto"` without a `vllm` key serves with the embedded runtime
        (install.sh --runtime) where no container runtime and no other host vLLM is known."""
        from epycd.host.runtimes import embedded_vllm

        wants_auto = any(
            r.spec
            and r.spec.engine in (self.engine, AUTO_ENGINE)
            and r.spec.runtime == "auto"
            and not r.spec.vllm
            for r in specs
        )
        if not wants_auto or host.runtimes.vllm is not None or container_runtime(host.runtimes):
            return host
        vllm = embedded_vllm(settings.runtime_dir)
        if vllm is None:
            return host
        runtimes = host.runtimes.model_copy(update={"vllm": sources.probe_vllm(vllm)})
        return host.model_copy(update={"runtimes": runtimes})

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
        file = result.path
        host_vllm: HostVllmFacts | None = None
        if needs_host_vllm(spec, host):
            host_vllm = sources.probe_vllm(spec.vllm) if spec.vllm else host.runtimes.vllm
        check_api_key(spec, file, secret_group)
        model = spec.model or stack.default_model
        if spec.device == "instinct":
            refuse_not_llm(model, file)
            route = gpu_route(spec, host, stack, file)
        else:
            route = route_endpoint(spec, host, stack, file, host_vllm)
        facts = sources.inspect(
            model,
            revision=spec.revision,
            vllm_version=route.vllm_version,
            token=read_token(spec, file, secret_group),
            chat_template_override=spec.chat_template,
            vllm_executable=route.vllm_executable,
        )
        warnings = check_model(spec, facts, stack, file)
        served_by = host_vllm if route.runtime == "host" else None
        return Prepared(result, spec, route, facts, warnings, host_vllm=served_by)

    def fits(
        self,
        prepared: Prepared,
        host: HostFacts,
        stack: Stack,
        placement: Placement,
        memory_share: float,
    ) -> bool:
        return size(prepared, host, stack, placement, memory_share)[1].fits

    decide = staticmethod(decide_cpu.decide)

    def gpu_sizer(self, prepared: Prepared) -> GpuSizer:
        return TensorParallelSizer(prepared)

    def decide_on_gpus(
        self, prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
    ) -> GpuServer:
        return decide_gpu(prepared, share, placement, port)

    def layout_warnings(self, slots: Sequence[Slot]) -> list[str]:
        """Rule 1 reserves no front-end core on an instance of one core."""
        single = [str(slot.index) for slot in slots if not front_end_cores(len(slot.cpus))]
        if not single:
            return []
        return [
            f"instance(s) {', '.join(single)} have one core: vLLM's front end shares the "
            "OpenMP core there (docs/tuning.md rule 1 reserves none on one core); fewer "
            "instances leave each one a front-end core"
        ]

    def unfit(self, prepared: Prepared, server: AnyServer) -> Refusal:
        assert isinstance(server, VllmCpuServer)
        fit = server.memory
        return Refusal(
            f"does not fit: {fit.required_gb} GiB needed (the server's processes "
            f"{fit.process_gb}: weights {fit.weights_gb} + KV pool "
            f"{fit.process_gb - fit.weights_gb - fit.runtime_gb:.0f} + vLLM's own "
            f"{fit.runtime_gb}; OS headroom {fit.headroom_gb}), "
            f"{fit.available_gb} GiB available on the socket's NUMA nodes",
            file=prepared.result.path,
            key="max_model_len",
            fix=fit.action,
        )


PLANNER = VllmPlanner()
