"""vLLM's endpoints in `epycctl plan`: its memory fit's keys, a set's per-process keys, an
Instinct endpoint's GPUs and VRAM fit; its rows of the confirmation table (`VIEW`); the
endpoint file of `epycctl quickstart` (`QUICKSTART`); and `vllm serve`'s plain defaults for
`epycctl bench --compare` (`PLAIN`)."""

from __future__ import annotations

import sys
from typing import Any

from epycd.cli.bench import BenchClient
from epycd.cli.bench_compare import LOOPBACK, PlainCommand, PlainServer
from epycd.cli.bench_runs import BenchRun
from epycd.cli.engine_view import GPU_KEYS, PlanView, Row, instances_json
from epycd.cli.model import FormatEstimate, budget_rows, print_answer, socket_memory
from epycd.cli.output import EXIT_NO, print_json
from epycd.cli.quickstart import (
    QuickstartFile,
    Wanted,
    endpoint_document,
    model_argument,
    pick_runtime,
)
from epycd.engines.vllm.cli.bench import offline_run, serve_runs
from epycd.engines.vllm.plan.argv import vllm_argv
from epycd.engines.vllm.plan.model import (
    VllmCpuServer,
    VllmInstinctServer,
    VllmService,
)
from epycd.engines.vllm.plan.sizing import SizingRequest, fit_request, longest_input
from epycd.engines.vllm.plan.tuning import batch_target
from epycd.errors import InputError
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import HostFacts
from epycd.host.runtimes import embedded_vllm
from epycd.model.facts import MemoryFit, ModelFacts
from epycd.model.formats import format_named
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.model import AnyServer
from epycd.plan.tuning import DEFAULT_PROFILE
from epycd.settings import Settings
from epycd.stack import shipped_stack

MEMORY_KEYS = (
    "weights_gb",
    "kv_gb",
    "kv_pool_gb",
    "kv_pool_cap_gb",
    "runtime_gb",
    "process_gb",
    "headroom_gb",
    "required_gb",
    "available_gb",
)
INSTANCE_KEYS = (
    "socket",
    "socket_reason",
    "cpus",
    "omp_cpus",
    "numa_nodes",
    "env",
    "kv_cache_gb",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
    "vllm_args",
)
"""The keys of one server process: a set has no single value for `env`, `vllm_args`,
`max_num_batched_tokens` and `enforce_eager` (null; each member has its own), and shows
the union of its members' CPUs and nodes, the socket they share (null across sockets), and
its tightest member's context, batch and KV pool."""


def memory_json(fit: MemoryFit) -> dict[str, Any]:
    dumped = fit.model_dump(mode="json")
    keys = (*MEMORY_KEYS, "fits", "suggested_max_model_len", "action")
    return {key: dumped[key] for key in keys}


def set_json(decided: EndpointDecisions) -> dict[str, Any]:
    """A set's per-process keys, and its instances."""
    keys = {key: getattr(decided, key, None) for key in INSTANCE_KEYS}
    return keys | {"instances": instances_json(decided, "vllm_args")}


def _cpu(server: AnyServer) -> VllmCpuServer:
    assert isinstance(server, VllmCpuServer), server.kind
    return server


def _vllm(decided: EndpointDecisions) -> VllmService:
    """What its servers share: which vLLM serves them, from where."""
    first = decided.first
    assert isinstance(first, VllmService), first.kind
    return first


def gpu_rows(decided: VllmInstinctServer) -> list[tuple[str, str]]:
    """`epycctl plan`'s rows for an Instinct endpoint: the VRAM fit, the GPUs and CPUs."""
    fit = decided.gpu_fit
    vram = (
        f"tensor parallel {fit.tensor_parallel_size}: weights {fit.weights_gb} + overhead "
        f"{fit.overhead_gb} of {fit.vram_gb} GiB per GPU, {fit.remaining_for_kv_gb} GiB left "
        f"for the KV cache ({fit.tier})"
    )
    return [
        ("VRAM fit", vram),
        (
            "GPUs / CPUs",
            f"Instinct {decided.gfx_version} GPU(s) {','.join(map(str, decided.gpus))} "
            f"(HIP_VISIBLE_DEVICES), pinned to CPUs {decided.cpus} and NUMA node(s) "
            f"{','.join(map(str, decided.numa_nodes))} ({decided.socket_reason})",
        ),
        (
            "Context",
            f"max_model_len {decided.max_model_len}"
            f"{', eager: tight VRAM' if decided.enforce_eager else ''}",
        ),
    ]


class VllmView(PlanView):
    engine = "vllm"

    def json_keys(self, decided: EndpointDecisions, dumped: dict[str, Any]) -> dict[str, Any]:
        if decided.instances is not None:
            tightest = _cpu(decided.tightest_server)
            return set_json(decided) | {"memory": memory_json(tightest.memory)}
        server = decided.first
        if isinstance(server, VllmInstinctServer):
            return {key: dumped[key] for key in GPU_KEYS} | {
                "vram": dumped["gpu_fit"],
                "omp_cpus": None,
                "max_num_batched_tokens": None,
                "memory": None,
                "vllm_args": server.vllm_args,
            }
        cpu = _cpu(server)
        return {"memory": memory_json(cpu.memory), "vllm_args": cpu.vllm_args}

    def backend_text(self, decided: EndpointDecisions) -> str:
        backend = _vllm(decided).backend
        if backend == "zentorch":
            return "zentorch acceleration (Zen4+)"
        if backend == "rocm":
            return "ROCm vLLM on AMD Instinct GPUs (docs/instinct.md)"
        return "stock vLLM CPU, no zentorch (no acceleration; verified on Milan)"

    def path_text(self, decided: EndpointDecisions) -> str:
        vllm = _vllm(decided)
        if decided.runtime == "host":
            return f"host vLLM {vllm.vllm_version} ({vllm.vllm_executable})"
        return f"container ({decided.runtime}, {vllm.image})"

    def endpoint_rows(self, decided: EndpointDecisions) -> list[Row]:
        server = decided.first
        if isinstance(server, VllmInstinctServer):
            return gpu_rows(server)
        return list(self.server_rows(server))

    def server_rows(self, server: AnyServer) -> tuple[Row, Row, Row]:
        decided = _cpu(server)
        fit = decided.memory
        eager = ", eager: no C++ compiler or Python headers" if decided.enforce_eager else ""
        return (
            (
                "Memory fit",
                f"required {fit.required_gb} GB (server {fit.process_gb}: weights "
                f"{fit.weights_gb} + KV pool {fit.kv_pool_gb} + vLLM's processes "
                f"{fit.runtime_gb}; OS headroom {fit.headroom_gb}), available "
                f"{fit.available_gb} GB on the socket's nodes: "
                f"{'fits' if fit.fits else 'does NOT fit'}",
            ),
            (
                "CPU config",
                f"socket {decided.socket} ({decided.socket_reason}), pinned {decided.cpus}, "
                f"OpenMP bind {decided.omp_cpus} (the rest is the front end's), "
                f"KV {decided.kv_cache_gb} GB (in socket), memory bound to NUMA nodes "
                f"{','.join(map(str, decided.numa_nodes))}",
            ),
            (
                "Context",
                f"max_model_len {decided.max_model_len}, max_num_seqs {decided.max_num_seqs}, "
                f"max_num_batched_tokens {decided.max_num_batched_tokens} "
                f"(profile {decided.profile}{eager})",
            ),
        )

    def set_bind_text(self, decided: EndpointDecisions) -> str:
        return f", OpenMP bind {decided.omp_cpus}"

    def member_text(self, member: AnyServer) -> tuple[str, str]:
        cpu = _cpu(member)
        front = sorted(set(parse_cpulist(cpu.cpus)) - set(parse_cpulist(cpu.omp_cpus)))
        threads = f"OpenMP {cpu.omp_cpus}, front end {format_cpulist(front) or 'shares the core'}"
        return threads, f"max_num_seqs {cpu.max_num_seqs}"


VIEW = VllmView()


class VllmQuickstart(QuickstartFile):
    """A vLLM endpoint's file: the default model or --model, on the runtime `auto` picks."""

    def candidate(
        self, settings: Settings, host: HostFacts, wanted: Wanted
    ) -> tuple[str, bytes, str]:
        if wanted.gguf_file is not None:
            gguf = format_named("gguf")
            engine = gguf.engine if gguf is not None else "an engine that serves GGUF files"
            raise InputError(
                f"--gguf-file is for {engine} endpoints",
                key="--gguf-file",
                fix=f"add --engine {engine}",
            )
        if wanted.quantize is not None:
            raise InputError(
                "--quantize is for endpoints whose safetensors model llama.cpp serves converted: "
                "vLLM serves the weights as they are",
                key="--quantize",
                fix="leave it out, or add --engine auto or --engine llama.cpp",
            )
        runtime, runtimes = pick_runtime(settings, host, wanted.vllm)
        served = model_argument(wanted.model or shipped_stack().default_model)
        content = endpoint_document(served, runtime, runtimes.vllm.path if runtimes.vllm else None)
        return served, content, runtime

    def runtime(self, settings: Settings, host: HostFacts) -> str:
        return pick_runtime(settings, host, None)[0]


QUICKSTART = VllmQuickstart()


class VllmBench(BenchClient):
    """vLLM's own: `vllm bench serve` of the endpoint's own vLLM, and `--offline` as
    `vllm bench throughput` with the endpoint's sizing."""

    offline = True

    def serve_runs(
        self,
        plan: Plan,
        concurrencies: tuple[int, ...],
        prompts_per_concurrency: int,
        lengths: tuple[int, int],
    ) -> list[BenchRun]:
        return serve_runs(plan, concurrencies, prompts_per_concurrency, lengths)

    def offline_run(
        self, plan: Plan, name: str, prompts_per_concurrency: int, lengths: tuple[int, int]
    ) -> BenchRun:
        return offline_run(plan, name, prompts_per_concurrency, lengths)


BENCH = VllmBench()


VLLM_START_BOUND_S = 600.0
"""A plain `vllm serve` loads and compiles before /health answers (about 90 s on 2 cores)."""


class VllmPlain(PlainServer):
    """`vllm serve MODEL --host 127.0.0.1 --port P`: the endpoint's own host vLLM on its
    model (revision pinned, from its HF cache); for another engine's endpoint, the embedded
    runtime's vLLM on the safetensors model that endpoint's GGUF was converted from."""

    label = "vllm serve, plain defaults"

    def own(self, plan: Plan, settings: Settings, port: int) -> PlainCommand:
        decisions = plan.decisions
        vllm = _vllm(decisions)
        if decisions.runtime != "host" or vllm.vllm_executable is None:
            return self.skip(
                f"a {decisions.runtime} endpoint: its vLLM is in the image {vllm.image}, not a "
                "host executable a plain `vllm serve` runs"
            )
        return self.command(plan, vllm.vllm_executable, decisions.model,
                            decisions.model_revision, port)  # fmt: skip

    def other(self, plan: Plan, settings: Settings, port: int) -> PlainCommand:
        choice = plan.decisions.engine_choice
        if choice is None or choice.converted is None:
            return self.skip(f"vLLM does not serve this GGUF ({plan.decisions.model})")
        vllm = embedded_vllm(settings.runtime_dir)
        if vllm is None:
            return self.skip(
                f"no vLLM: the embedded runtime is not installed in {settings.runtime_dir}; "
                "packaging/install.sh --runtime installs it"
            )
        converted = choice.converted
        return self.command(plan, vllm, converted.source, converted.source_revision, port)

    def planned(self, plan: Plan, port: int) -> PlainCommand:
        decisions = plan.decisions
        server = decisions.first
        if not isinstance(server, VllmCpuServer) or server.invocation is None:
            return self.skip(f"its plan is not one vLLM on this host's CPUs ({decisions.device})")
        if decisions.runtime != "host" or server.vllm_executable is None:
            return self.skip(
                f"its plan runs vLLM in {decisions.runtime}'s image {server.image}, not a host "
                "executable"
            )
        invocation = server.invocation.model_copy(update={"host": LOOPBACK, "port": port})
        cache = decisions.hf_cache
        return PlainCommand(
            label=self.label,
            port=port,
            argv=[server.vllm_executable, "serve", *vllm_argv(invocation)],
            env=dict(server.env) | ({"HF_HOME": cache.host_path} if cache else {}),
            start_bound_s=VLLM_START_BOUND_S,
            cpus=server.cpus,
        )

    def command(
        self, plan: Plan, vllm: str, model: str, revision: str | None, port: int
    ) -> PlainCommand:
        argv = [vllm, "serve", model, "--host", LOOPBACK, "--port", str(port)]
        argv += ["--revision", revision] if revision else []
        cache = plan.decisions.hf_cache
        return PlainCommand(
            label=self.label,
            port=port,
            argv=argv,
            env={"HF_HOME": cache.host_path} if cache else {},
            start_bound_s=VLLM_START_BOUND_S,
        )


PLAIN = VllmPlain()


class VllmEstimate(FormatEstimate):
    """`epycctl estimate` of a Hugging Face model as vLLM serves it: weights, the KV the
    sequences need, the tuner's pool and vLLM's own processes, in one socket's memory."""

    def run(
        self,
        facts: ModelFacts,
        max_model_len: int | None,
        max_num_seqs: int | None,
        socket_gb: float | None,
        as_json: bool,
    ) -> None:
        if facts.weights_bytes is None:
            raise InputError(
                f"{facts.model}: the weights' size is unknown (no safetensors metadata, config "
                "too sparse)",
                key="model",
                fix="use a model with safetensors weights",
            )
        total, available, first_node, note = socket_memory(socket_gb)
        fit, footprint_warnings = fit_request(
            SizingRequest(
                vllm_version=facts.support.vllm_version,
                weights_bytes=facts.weights_bytes,
                kv_bytes_per_token=facts.kv_bytes_per_token,
                max_position_embeddings=longest_input(facts),
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                # a balanced plan's target, whatever its cores
                target=batch_target(DEFAULT_PROFILE, 1),
                total_gib=total,
                available_gib=available,
                first_node_available_gib=first_node,
                pooling=facts.pooling,
            )
        )
        facts.warnings += footprint_warnings
        if as_json:
            print_json(estimate_json(facts, fit, note))
        else:
            print_fit(facts, fit, note)
        if not fit.fits:
            sys.exit(EXIT_NO)


def estimate_json(facts: ModelFacts, fit: MemoryFit, socket_note: str) -> dict[str, Any]:
    return {
        "model": facts.model,
        "revision": facts.revision,
        "weights_source": facts.weights_source,
        **fit.model_dump(),
        "socket": socket_note,
        "warnings": facts.warnings,
    }


def print_fit(facts: ModelFacts, fit: MemoryFit, note: str) -> None:
    rows = [
        ("model", facts.model),
        ("weights", f"{fit.weights_gb} GiB ({facts.weights_source})"),
        ("KV per token", f"{fit.kv_bytes_per_token} bytes"),
        ("context x sequences", f"{fit.context} x {fit.max_num_seqs}"),
        ("KV needed", f"{fit.kv_gb} GiB"),
        ("KV pool", f"{fit.kv_pool_gb} GiB"),
        ("vLLM's processes", f"{fit.runtime_gb} GiB"),
        (
            "server at peak",
            f"{fit.process_gb} GiB (weights + the KV the sequences need + vLLM's processes)",
        ),
        *budget_rows(fit.headroom_gb, fit.required_gb, fit.available_gb, note, fit.fits),
    ]
    if fit.suggested_max_model_len:
        rows.append(("suggested max_model_len", str(fit.suggested_max_model_len)))
    print_answer(rows, facts.warnings, fit.action)


ESTIMATE = VllmEstimate()
