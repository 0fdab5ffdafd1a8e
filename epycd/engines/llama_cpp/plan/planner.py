"""llama.cpp's planner: its llama-server (the one the endpoint file names, `llama_server`, or
the llama.cpp runtime's that `install.sh --engine llama.cpp` built, `embedded_llama_server`),
asked its version (`probe_llama_server`: `llama-server --version` prints it and exits) only
when an endpoint asks for it (`with_llama_runtime`); its route (`llama_route`); the GGUF
model check (`check_llama_model`); the memory fit of one process (`decide.llama_fit`) and one
server's decisions (`decide.decide_llama`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from epycd.childproc import run_bounded
from epycd.engines.llama_cpp import EMBEDDED_RUNTIME, LLAMA_CPP, install_command
from epycd.engines.llama_cpp.model.convert import CONVERTER_DIR, CONVERTER_SCRIPT, converter_refusal
from epycd.engines.llama_cpp.model.format import pinned_version
from epycd.engines.llama_cpp.plan.converted import (
    converted_path,
    converter_python_present,
    current_record,
    needs_conversion,
    quantize_of,
    read_refused,
    refused_path,
)
from epycd.engines.llama_cpp.plan.decide import decide_llama, llama_fit
from epycd.engines.llama_cpp.plan.model import (
    LlamaRoute,
    LlamaServer,
)
from epycd.engines.llama_cpp.settings import LlamaSettings
from epycd.engines.llama_cpp.spec import CONVERTING, LlamaKeys
from epycd.errors import InputError, Refusal
from epycd.host.facts import HostFacts, ServerFacts
from epycd.model.facts import ModelFacts
from epycd.model.hub import is_gguf
from epycd.plan.engines.planner import EnginePlanner
from epycd.plan.model import AnyServer, EngineChoice
from epycd.plan.placement.alloc import Placement
from epycd.plan.prepared import Prepared, Sources
from epycd.plan.route import refuse_non_epyc
from epycd.plan.service.secrets import check_api_key, read_token
from epycd.settings import Settings
from epycd.sizes import gib
from epycd.spec import EndpointSpec, SpecResult
from epycd.stack import Stack

VERSION_TIMEOUT_S = 5
"""`llama-server --version` loads its backends and prints a few lines: well under a second."""
STAMP = ".epyc-stamp"
"""packaging/llama-runtime.sh's record of the source it built, in the runtime's folder."""


def embedded_llama_server(runtime_dir: Path) -> str | None:
    """The llama.cpp runtime's `llama-server`, where its recipe finished (its stamp is there)."""
    server = runtime_dir / "bin" / "llama-server"
    finished = (runtime_dir / STAMP).is_file()
    return str(server) if finished and os.access(server, os.X_OK) else None


def probe_llama_server(path: str) -> ServerFacts:
    """The server at `path` and its version line; `present` False with why it cannot run."""
    if not os.access(path, os.X_OK) or not Path(path).is_file():
        return ServerFacts(path=path, present=False, error="no executable file there")
    try:
        done = run_bounded(
            [path, "--version"],
            timeout=VERSION_TIMEOUT_S,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    except (OSError, subprocess.SubprocessError) as error:
        return ServerFacts(path=path, present=False, error=str(error))
    lines = (done.stdout + done.stderr).splitlines()
    version = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("version:")), None
    )
    if done.returncode != 0 or version is None:
        tail = lines[-1] if lines else f"exit {done.returncode}"
        return ServerFacts(path=path, present=False, error=f"--version failed: {tail}")
    return ServerFacts(path=path, present=True, version=version)


ENGINE = LLAMA_CPP.name
LlamaProber = Callable[[str], ServerFacts]
"""A llama-server executable -> what it is (`probe_llama_server`)."""
LLAMA_RUNTIME_FIX = (
    f"build llama-server for this CPU ({install_command(EMBEDDED_RUNTIME)}), "
    "or set llama_server = the path of a llama-server of your own"
)


def llama_route(spec: EndpointSpec, host: HostFacts, file: Path, probe: LlamaProber) -> LlamaRoute:
    """The llama-server the endpoint file names, else the llama.cpp runtime's; refused
    (1) when there is none, bad input (2) when the file names one that cannot run."""
    refuse_non_epyc(host)
    own = LlamaKeys.of(spec).llama_server
    server = probe(own) if own else host.runtimes.servers.get(ENGINE)
    if server is None:
        raise Refusal(
            "no llama-server: the llama.cpp runtime is not built on this host",
            file=file,
            key="engine",
            fix=LLAMA_RUNTIME_FIX,
        )
    if not server.present or server.version is None:
        error = InputError if own else Refusal
        raise error(
            f"the llama-server {server.path} cannot be used: {server.error}",
            file=file,
            key="llama_server" if own else "engine",
            fix=LLAMA_RUNTIME_FIX,
        )
    return LlamaRoute(llama_server=server.path, llama_version=server.version)


def with_llama_runtime(
    host: HostFacts, runtime_dir: Path, specs: list[SpecResult], probe: LlamaProber
) -> HostFacts:
    """llama.cpp endpoints without a `llama_server` key serve with the llama.cpp runtime's
    (install.sh --engine llama.cpp); probed only when one asks for it."""
    wanted = any(
        r.spec and r.spec.engine in CONVERTING and not LlamaKeys.of(r.spec).llama_server
        for r in specs
    )
    server = embedded_llama_server(runtime_dir) if wanted else None
    if server is None:
        return host
    servers = {**host.runtimes.servers, ENGINE: probe(server)}
    runtimes = host.runtimes.model_copy(update={"servers": servers})
    return host.model_copy(update={"runtimes": runtimes})


def check_llama_model(facts: ModelFacts, file: Path) -> list[str]:
    """Refuse what llama.cpp cannot serve on an endpoint of its primary path; return
    warnings."""
    llama = next((e for e in facts.engines if e.engine == ENGINE), None)
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


DEFAULT_WEIGHTS_NOTE = (
    'q8_0 is the default, near-lossless; quantize = "q4_k_m", Ollama\'s weights, reads 1.8x '
    "fewer bytes per token: 1.7x the tokens/s for one user and 1.5x at 8 on the ~100M model "
    "measured, at some accuracy (docs/tuning.md rule 12)"
)
"""Told where the file leaves `quantize` to its default on a text model, whose decoding reads
every weight for each token: the trade it makes for the admin (benchmarks/auto-engine-results.md,
run 2: 304.8 against 531.6 tok/s at 1, 505.3 against 747.1 at 8)."""


def prepare_converted(
    result: SpecResult, route: LlamaRoute, sources: Sources, token: str | None
) -> Prepared:
    """A safetensors model, served as the GGUF file approve converted it to: refused where
    the pinned converter does not take its architecture or no Python can run the converter,
    `NeedsConversion` until the file is there (docs/conversion.md)."""
    spec, file = result.spec, result.path
    assert spec is not None and spec.model is not None
    source = sources.inspect(spec.model, revision=spec.revision, token=token)
    refusal = converter_refusal(source.architectures)
    if refusal is not None:
        raise Refusal(refusal, file=file, key="model", fix='serve it with engine = "vllm"')
    settings = sources.settings or Settings()
    python = settings.runtime_dir / "bin" / "python"
    if not converter_python_present(python):
        raise Refusal(
            f"converting {spec.model} to GGUF needs the converter's Python ({python}), "
            "which is not installed",
            file=file,
            key="model",
            fix="install the vLLM runtime (packaging/install.sh --runtime), whose Python "
            'runs llama.cpp\'s converter; or give model = a .gguf file; or set engine = "vllm"',
        )
    llama_settings = LlamaSettings.of(settings)
    converter = llama_settings.llama_runtime_dir / CONVERTER_DIR / CONVERTER_SCRIPT
    if not converter.is_file():
        raise Refusal(
            f"converting {spec.model} to GGUF needs llama.cpp's converter ({converter}), "
            "which is not installed",
            file=file,
            key="model",
            fix="run the llama.cpp runtime's recipe again (packaging/install.sh --engine "
            'llama.cpp), which installs it beside llama-server; or set engine = "vllm"',
        )
    quantize = quantize_of(LlamaKeys.of(spec).quantize)
    converted_dir = llama_settings.llama_converted_dir
    gguf = converted_path(converted_dir, spec.model, source.revision, quantize)
    refused = read_refused(gguf, pinned_version())
    if refused is not None:
        raise Refusal(
            f"llama.cpp {refused.llama_cpp}'s converter failed on {spec.model} when approve "
            f"converted it: {refused.reason}",
            file=file,
            key="model",
            fix='serve it with engine = "vllm" (engine = "auto" does), or give model = a '
            f".gguf file; to let approve try again, remove {refused_path(gguf)}",
        )
    record = current_record(gguf, spec.model, source.revision)
    if isinstance(record, str):
        raise needs_conversion(
            result.name, spec.model, source.revision, quantize, gguf, file, spec.hf_token_file,
            pooling=source.pooling, why=record,
        )  # fmt: skip
    facts = sources.inspect(str(gguf))
    warnings = [*source.warnings, *check_llama_model(facts, file)]
    converted = (
        f"{spec.model} converted to {quantize} by llama.cpp {record.llama_cpp}'s converter: {gguf}"
    )
    chosen_weights = LlamaKeys.of(spec).quantize is not None or facts.pooling
    choice = EngineChoice(
        asked=spec.engine,
        reasons=[converted] if chosen_weights else [converted, DEFAULT_WEIGHTS_NOTE],
        converted=record.weights(),
    )
    return Prepared(result, spec, route, facts, warnings, engine_choice=choice)


def refuse_quantize_of_gguf(spec: EndpointSpec, model: str, file: Path) -> None:
    """`quantize` names the weights a safetensors model is converted to; a GGUF file's
    weights are as they were made, so the key would be ignored: refused instead."""
    quantize = LlamaKeys.of(spec).quantize
    if quantize is not None:
        raise InputError(
            f'quantize = "{quantize}" chooses the weights a safetensors model is converted to, '
            f"and {model} is already a GGUF file (its weights are as they were made)",
            file=file,
            key="quantize",
            fix="remove quantize to serve the GGUF file as it is, or point model at the "
            "safetensors source to have approve convert it to those weights",
        )


class LlamaPlanner(EnginePlanner):
    engine = "llama.cpp"

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
        model = spec.model or stack.default_model
        token = read_token(spec, file, secret_group)
        if not is_gguf(model, spec.gguf_file):
            return prepare_converted(result, route, sources, token)
        refuse_quantize_of_gguf(spec, model, file)
        facts = sources.inspect(
            model, revision=spec.revision, token=token, gguf_file=spec.gguf_file
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

    def unfit(self, prepared: Prepared, server: AnyServer) -> Refusal:
        assert isinstance(server, LlamaServer)
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
