"""llama.cpp's commands: its endpoints in `epycctl plan` (`VIEW`: its server's keys
(`llama_server`, `llama_version`, `gguf_file`, `server_args`), its fit's terms, its slots
sharing one KV pool), `epycctl estimate` of a GGUF file (`ESTIMATE`), the endpoint file of
`epycctl quickstart --engine llama.cpp` (`QUICKSTART`) and llama-server's plain defaults
for `epycctl bench --compare` (`PLAIN`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from epycd.cli.bench_compare import LOOPBACK, PlainCommand, PlainServer
from epycd.cli.engine_view import PlanView, Row, instances_json
from epycd.cli.model import FormatEstimate, budget_rows, print_answer, socket_memory, this_host
from epycd.cli.output import EXIT_NO, print_json
from epycd.cli.quickstart import (
    NoRuntime,
    QuickstartFile,
    Wanted,
    model_argument,
    quickstart_document,
)
from epycd.engines.llama_cpp import install_command
from epycd.engines.llama_cpp.model.convert import QUANTIZE
from epycd.engines.llama_cpp.model.memory import UnmeasuredModel
from epycd.engines.llama_cpp.plan.converted import converted_path
from epycd.engines.llama_cpp.plan.decide import fit_llama, memory_source, pooling_ubatch
from epycd.engines.llama_cpp.plan.fit import fit_words_at
from epycd.engines.llama_cpp.plan.model import (
    POOLING_FLAGS,
    LlamaFit,
    LlamaServer,
    LlamaService,
    llama_server_argv,
    pooling_served,
)
from epycd.engines.llama_cpp.plan.planner import embedded_llama_server
from epycd.engines.llama_cpp.settings import LlamaSettings
from epycd.errors import InputError, Refusal
from epycd.host.facts import HostFacts
from epycd.model.facts import GgufFile, ModelFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.model import AnyServer
from epycd.settings import Settings, load_settings
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


def _server(server: AnyServer) -> LlamaServer:
    assert isinstance(server, LlamaServer), server.kind
    return server


def _service(decided: EndpointDecisions) -> LlamaService:
    """What its servers share: which llama-server serves which GGUF file."""
    return _server(decided.first)


class LlamaView(PlanView):
    engine = "llama.cpp"
    plan_keys = PLAN_KEYS

    def json_keys(self, decided: EndpointDecisions, dumped: dict[str, Any]) -> dict[str, Any]:
        if decided.instances is not None:
            keys = {key: getattr(decided, key) for key in SET_KEYS}
            return keys | {
                "memory": _server(decided.tightest_server).fit.model_dump(mode="json"),
                "instances": instances_json(decided, "server_args"),
            }
        server = _server(decided.first)
        return {
            "kv_cache_gb": server.kv_cache_gb,
            "max_model_len": server.max_model_len,
            "max_num_seqs": server.max_num_seqs,
            "memory": dumped["fit"],
            "server_args": server.server_args,
        }

    def backend_text(self, decided: EndpointDecisions) -> str:
        return f"llama.cpp {_service(decided).llama_version} (llama-server built for this CPU)"

    def path_text(self, decided: EndpointDecisions) -> str:
        service = _service(decided)
        return f"host llama-server ({service.llama_server}), {service.gguf_file}"

    def endpoint_rows(self, decided: EndpointDecisions) -> list[Row]:
        return list(self.server_rows(decided.first))

    def server_rows(self, server: AnyServer) -> tuple[Row, Row, Row]:
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

    def member_text(self, member: AnyServer) -> tuple[str, str]:
        server = _server(member)
        threads = f"{server.invocation.threads} threads"
        return threads, f"{server.max_num_seqs} slots, context {server.max_model_len}"


VIEW = LlamaView()


LLAMA_DEFAULT_SLOTS = 4
"""llama-server's own default (`-np` auto: 4 slots sharing one unified cache)."""


class GgufEstimate(FormatEstimate):
    def run(
        self,
        facts: ModelFacts,
        max_model_len: int | None,
        max_num_seqs: int | None,
        socket_gb: float | None,
        as_json: bool,
    ) -> None:
        if facts.gguf is None:
            raise InputError(f"{facts.model}: no GGUF file's facts", key="model")
        estimate_gguf(facts, facts.gguf, max_model_len, max_num_seqs, socket_gb, as_json)


ESTIMATE = GgufEstimate()


def settings_runtime_dir() -> Path:
    """The llama.cpp runtime's folder, from epycd's settings (read only when it is asked)."""
    return LlamaSettings.of(load_settings()).llama_runtime_dir


def runtime_llama_server() -> str | None:
    """The llama.cpp runtime's llama-server, where it is built."""
    return embedded_llama_server(settings_runtime_dir())


def estimate_gguf(
    facts: ModelFacts,
    gguf: GgufFile,
    max_model_len: int | None,
    max_num_seqs: int | None,
    socket_gb: float | None,
    as_json: bool,
) -> None:
    """The fit of llama-server serving the file: `--max-num-seqs` slots (default 4, the
    server's own) of `--max-model-len` tokens each (default: what the model was trained for,
    which is also the most a slot takes)."""
    trained = gguf.context_length
    context = max_model_len or trained
    if context is None:
        raise InputError(
            f"{facts.model}: the GGUF file gives no context length "
            f"({gguf.architecture}.context_length)",
            key="max-model-len",
            fix="give --max-model-len",
        )
    if trained and context > trained:
        raise InputError(
            f"{facts.model}: --max-model-len {context} is above the {trained} tokens the model "
            "was trained for (llama-server caps each slot there)",
            key="max-model-len",
            fix=f"give --max-model-len {trained} or less",
        )
    host = this_host()  # its CPU flags decide which matrices llama.cpp repacks
    total, available, _, note = socket_memory(socket_gb, host)
    slots, ubatch = max_num_seqs or LLAMA_DEFAULT_SLOTS, pooling_ubatch(facts.pooling, context)
    words_at = fit_words_at(
        os.path.realpath(gguf.path), threads=1, slots=slots, ubatch=ubatch,
        pooling=pooling_served(facts.primary_endpoint), load_mode="mmap",
    )  # fmt: skip
    try:
        memory_at = memory_source(
            gguf, slots=slots, cpu_flags=host.flags, ubatch=ubatch, shared_pool=False,
            embeddings=facts.pooling, llama_server=runtime_llama_server(), words_at=words_at,
        )  # fmt: skip
        fit = fit_llama(
            gguf,
            context=context,
            slots=slots,
            cpu_flags=host.flags,
            total_gib=total,
            available_gib=available,
            ubatch=ubatch,
            embeddings=facts.pooling,
            memory_at=memory_at,
        )
    except UnmeasuredModel as unknown:
        raise Refusal(
            f"{facts.model}: the memory of llama-server serving it is unknown: {unknown}",
            key="model",
            fix="build the llama.cpp runtime, whose llama-server says the memory of every "
            f"architecture it loads: {install_command(settings_runtime_dir())}",
        ) from None
    if as_json:
        print_json(
            {
                "model": facts.model,
                "engine": "llama.cpp",
                "gguf_file": gguf.file,
                **fit.model_dump(),
                "socket": note,
                "warnings": facts.warnings,
            }
        )
    else:
        _print_llama_fit(facts, gguf, fit, note)
    if not fit.fits:
        sys.exit(EXIT_NO)


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


def _print_llama_fit(facts: ModelFacts, gguf: GgufFile, fit: LlamaFit, note: str) -> None:
    memory = fit.memory
    rows = [
        ("model", f"{facts.model} ({gguf.file}, {gguf.file_type or 'unknown type'})"),
        ("engine", "llama.cpp (llama-server)"),
        ("slots x context", f"{fit.slots} x {fit.context} ({memory.cells} cells, one pool)"),
        ("weights", f"{_mib(memory.weights_bytes)} (the file's tensors, mapped)"),
        ("repacked", f"{_mib(memory.repacked_bytes)} (the CPU backend's copy of some matrices)"),
        ("KV cache", _mib(memory.kv_bytes)),
        ("compute", f"{_mib(memory.compute_bytes)} (ubatch {memory.ubatch})"),
        ("output", _mib(memory.output_bytes)),
        ("server", _mib(memory.server_bytes)),
        ("server at peak", f"{fit.process_gb} GiB"),
        *budget_rows(fit.headroom_gb, fit.required_gb, fit.available_gb, note, fit.fits),
    ]
    if fit.suggested_context:
        rows.append(("suggested context per slot", str(fit.suggested_context)))
    print_answer(rows, facts.warnings, fit.action)


class LlamaQuickstart(QuickstartFile):
    """A llama.cpp endpoint's file: its GGUF model, served by the llama.cpp runtime."""

    def candidate(
        self, settings: Settings, host: HostFacts, wanted: Wanted
    ) -> tuple[str, bytes, str]:
        if wanted.vllm is not None:
            raise InputError(
                "--vllm is for vLLM endpoints",
                key="--vllm",
                fix="leave it out with --engine llama.cpp",
            )
        if wanted.model is None:
            raise InputError(
                "a llama.cpp endpoint serves a GGUF model: none given",
                key="--model",
                fix="give --model /path/to/model.gguf (or a hub repository with --gguf-file)",
            )
        server = embedded_llama_server(LlamaSettings.of(settings).llama_runtime_dir)
        if server is None:
            raise runtime_refusal(settings)
        served = model_argument(wanted.model)
        data = {"engine": "llama.cpp", "model": served}
        if wanted.gguf_file:
            data["gguf_file"] = wanted.gguf_file
        if wanted.quantize is not None:
            data["quantize"] = wanted.quantize
        return served, quickstart_document(data), f"host (llama.cpp, {server})"

    def runtime(self, settings: Settings, host: HostFacts) -> str:
        runtime_dir = LlamaSettings.of(settings).llama_runtime_dir
        server = embedded_llama_server(runtime_dir)
        if server is not None:
            return f"host ({server})"
        raise NoRuntime(
            [f"llama-server: not built in {runtime_dir}"],
            [
                "build llama.cpp's llama-server for this CPU (about 13 minutes on 2 cores): "
                f"{install_command(runtime_dir)}"
            ],
        )


QUICKSTART = LlamaQuickstart()


def runtime_refusal(settings: Settings) -> Refusal:
    runtime_dir = LlamaSettings.of(settings).llama_runtime_dir
    return Refusal(
        f"no llama-server: the llama.cpp runtime is not built in {runtime_dir}",
        fix="build it once for this CPU: "
        f"{install_command(runtime_dir)} (about 13 minutes on 2 "
        "cores); nothing was changed",
    )


class LlamaPlain(PlainServer):
    """`llama-server -m GGUF --host 127.0.0.1 --port P`: how Ollama-like users run it. The
    endpoint's own runtime binary and file; for another engine's endpoint, the runtime's
    binary and the GGUF file the product converted the model to, where there is one."""

    label = "llama-server, plain defaults"

    def own(self, plan: Plan, settings: Settings, port: int) -> PlainCommand:
        server = _server(plan.decisions.first)
        return self.command(plan, server.llama_server, server.invocation.model_path, port)

    def other(self, plan: Plan, settings: Settings, port: int) -> PlainCommand:
        decisions = plan.decisions
        converted_dir = LlamaSettings.of(settings).llama_converted_dir
        paths = [
            converted_path(converted_dir, decisions.model, decisions.model_revision, quantize)
            for quantize in QUANTIZE
        ]
        gguf = next((path for path in paths if path.is_file()), None)
        if gguf is None:
            return self.skip(
                f"llama.cpp serves a GGUF file: no conversion of {decisions.model} in "
                f"{converted_dir}; make one with `epycctl convert {decisions.model} "
                f"--output {paths[0]}`"
            )
        server = embedded_llama_server(LlamaSettings.of(settings).llama_runtime_dir)
        if server is None:
            refusal = runtime_refusal(settings)
            return self.skip(f"{refusal.message}; {refusal.fix}")
        return self.command(plan, server, str(gguf), port)

    def planned(self, plan: Plan, port: int) -> PlainCommand:
        server = _server(plan.decisions.first)
        invocation = server.invocation.model_copy(update={"host": LOOPBACK, "port": port})
        argv = [server.llama_server, *llama_server_argv(invocation)]
        return PlainCommand(label=self.label, port=port, argv=argv, cpus=server.cpus)

    def command(self, plan: Plan, server: str, gguf: str, port: int) -> PlainCommand:
        """llama-server's defaults, with the one flag an embedder or reranker needs to be
        served on its path at all."""
        argv = [server, "-m", gguf, "--host", LOOPBACK, "--port", str(port)]
        pooling = pooling_served(plan.decisions.primary_endpoint)
        argv += [POOLING_FLAGS[pooling]] if pooling else []
        return PlainCommand(label=self.label, port=port, argv=argv)


PLAIN = LlamaPlain()
