"""Each endpoint file made ready for placement (`prepare`, `prepare_all`): its secrets
checked, its route chosen (`epycd.plan.route`), its model inspected and refused when vLLM
cannot serve it on a chat or completions endpoint (`check_model`). The model inspector and
the vLLM prober each run once per model or executable in one planning run
(`memoized_sources`); `runtime = "auto"` without a `vllm` key serves with the embedded
runtime where no container runtime and no other host vLLM is known
(`with_embedded_runtime`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from epycd.errors import EpycError, Refusal
from epycd.host.facts import HostFacts, HostVllmFacts, LlamaServerFacts
from epycd.host.llama_server import probe_llama_server
from epycd.host.probe_cache import ProbeCache
from epycd.host.pyheaders import with_python_headers
from epycd.model.facts import ModelFacts
from epycd.paths import EMBEDDED_LLAMA_RUNTIME
from epycd.plan.result import EndpointResult, against_endpoint_file, crashed, failed
from epycd.plan.route import (
    LlamaRoute,
    Route,
    container_runtime,
    gpu_route,
    llama_route,
    refuse_not_llm,
    route_endpoint,
)
from epycd.plan.secrets import UnreadableHere, check_api_key, read_token, unreadable_here
from epycd.settings import Settings
from epycd.spec import EndpointSpec, SpecResult
from epycd.stack import Stack

ModelInspector = Callable[..., ModelFacts]


VllmProber = Callable[[str], HostVllmFacts]


LlamaProber = Callable[[str], LlamaServerFacts]


@dataclass
class Prepared:
    """An endpoint whose file, route and model passed: ready for placement and sizing."""

    result: SpecResult
    spec: EndpointSpec
    route: Route | LlamaRoute
    facts: ModelFacts
    warnings: list[str] = field(default_factory=list)
    host_vllm: HostVllmFacts | None = None
    """The host vLLM it runs on the host path, as probed (with its interpreter's headers)."""

    @property
    def vllm_route(self) -> Route:
        """The route of a vLLM endpoint: the vLLM stages are never given a llama.cpp one."""
        if not isinstance(self.route, Route):
            raise TypeError(f"{self.result.name} is a llama.cpp endpoint, not vLLM's")
        return self.route


def default_inspector(model: str, **kwargs: object) -> ModelFacts:
    from epycd.model.check import inspect_model

    return inspect_model(model, **kwargs)  # type: ignore[arg-type]


def needs_host_vllm(spec: EndpointSpec, host: HostFacts) -> bool:
    if spec.device == "instinct":
        return False
    if spec.runtime == "host":
        return True
    return spec.runtime == "auto" and container_runtime(host.runtimes) is None


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


def check_model(spec: EndpointSpec, facts: ModelFacts, stack: Stack, file: Path) -> list[str]:
    """Refuse what vLLM cannot serve on a chat/completions endpoint; return warnings."""
    if facts.format == "gguf":
        vllm = next(e for e in facts.engines if e.engine == "vllm")
        raise Refusal(
            vllm.reason,
            file=file,
            key="model",
            fix='serve it with engine = "llama.cpp", or give a model folder or hub id with '
            "safetensors weights",
        )
    if facts.support.supported is False or not facts.launchable:
        raise Refusal(facts.message or "vLLM cannot serve this model", file=file, key="model")
    if facts.primary_endpoint not in ("chat_completions", "completions"):
        raise Refusal(
            f"{facts.model} is a {facts.support.kind} model: no chat or completions endpoint",
            file=file,
            key="model",
            fix="choose a text-generation model",
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


def prepare_llama(
    result: SpecResult,
    host: HostFacts,
    stack: Stack,
    inspect: ModelInspector,
    probe_llama: LlamaProber,
    secret_group: int | None = None,
) -> Prepared:
    """A llama.cpp endpoint: its llama-server, its key and token, its GGUF file read."""
    spec = result.spec
    assert spec is not None
    file = result.path
    route = llama_route(spec, host, file, probe_llama)
    check_api_key(spec, file, secret_group)
    facts = inspect(
        spec.model or stack.default_model,
        revision=spec.revision,
        token=read_token(spec, file, secret_group),
        gguf_file=spec.gguf_file,
    )
    return Prepared(result, spec, route, facts, check_llama_model(facts, file))


def prepare(
    result: SpecResult,
    host: HostFacts,
    stack: Stack,
    inspect: ModelInspector,
    probe: Callable[[str], HostVllmFacts],
    secret_group: int | None = None,
    probe_llama: LlamaProber = probe_llama_server,
) -> Prepared:
    """`secret_group`: the admin group root's epycd.conf names (`trusted_admin_gid`), which
    may be the group of a key or token file (`read_root_only`)."""
    spec = result.spec
    assert spec is not None
    if spec.engine == "llama.cpp":
        return prepare_llama(result, host, stack, inspect, probe_llama, secret_group)
    file = result.path
    host_vllm = None
    if needs_host_vllm(spec, host):
        host_vllm = probe(spec.vllm) if spec.vllm else host.runtimes.vllm
    check_api_key(spec, file, secret_group)
    model = spec.model or stack.default_model
    if spec.device == "instinct":
        refuse_not_llm(model, file)
        route = gpu_route(spec, host, stack, file)
    else:
        route = route_endpoint(spec, host, stack, file, host_vllm)
    facts = inspect(
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


def memoized_sources(
    settings: Settings, inspect: ModelInspector | None, probe: VllmProber | None, root: Path
) -> tuple[ModelInspector, VllmProber]:
    """The model inspector and vLLM prober (by default through the probe cache of
    `settings.run_dir`), each asked once per model or executable in one planning run; a
    probed vLLM comes with its interpreter's Python headers on the host at `root`."""
    probes = ProbeCache.in_run_dir(settings.run_dir)
    inspect_model = inspect or functools.partial(default_inspector, probe_cache=probes)
    probe_vllm = probe or probes.probe
    probed: dict[str, HostVllmFacts] = {}
    inspected: dict[tuple[object, ...], ModelFacts] = {}

    def cached_probe(executable: str) -> HostVllmFacts:
        if executable not in probed:
            probed[executable] = with_python_headers(probe_vllm(executable), root)
        return probed[executable]

    def cached_inspect(model: str, **kwargs: object) -> ModelFacts:
        key = (model, *sorted(kwargs.items()))
        if key not in inspected:
            inspected[key] = inspect_model(model, **kwargs)
        return inspected[key]

    return cached_inspect, cached_probe


def prepare_all(
    specs: list[SpecResult],
    host: HostFacts,
    stack: Stack,
    inspect: ModelInspector,
    probe: VllmProber,
    secret_group: int | None = None,
    probe_llama: LlamaProber = probe_llama_server,
) -> tuple[dict[str, EndpointResult], list[Prepared]]:
    """Each endpoint file routed and its model inspected: the failed ones as results, the
    others ready to be placed. Each on its own: one that raises what no rule foresaw is its
    own failure (`crashed`), never the others'."""
    results: dict[str, EndpointResult] = {}
    ready: list[Prepared] = []
    for spec_result in specs:
        if not spec_result.ok:
            results[spec_result.name] = failed(
                spec_result, *spec_result.errors, unreadable_here=unreadable_here(spec_result.path)
            )
            continue
        try:
            ready.append(
                prepare(spec_result, host, stack, inspect, probe, secret_group, probe_llama)
            )
        except EpycError as exc:
            against_endpoint_file(exc, spec_result.path)
            here = exc.path if isinstance(exc, UnreadableHere) else None
            results[spec_result.name] = failed(spec_result, exc, unreadable_here=here)
        except Exception as exc:  # the planning boundary: any other error is this file's
            results[spec_result.name] = crashed(spec_result, exc, "preparing the endpoint")
    return results, ready


def with_llama_runtime(
    host: HostFacts, runtime_dir: Path, specs: list[SpecResult], probe: LlamaProber
) -> HostFacts:
    """llama.cpp endpoints without a `llama_server` key serve with the llama.cpp runtime's
    (install.sh --engine llama.cpp); probed only when one asks for it."""
    from epycd.host.llama_server import embedded_llama_server

    wanted = any(r.spec and r.spec.engine == "llama.cpp" and not r.spec.llama_server for r in specs)
    server = embedded_llama_server(runtime_dir) if wanted else None
    if server is None:
        return host
    runtimes = host.runtimes.model_copy(update={"llama_server": probe(server)})
    return host.model_copy(update={"runtimes": runtimes})


def with_embedded_runtime(
    host: HostFacts,
    runtime_dir: Path,
    specs: list[SpecResult],
    probe: VllmProber,
    llama_runtime_dir: Path = EMBEDDED_LLAMA_RUNTIME,
    probe_llama: LlamaProber = probe_llama_server,
) -> HostFacts:
    """`runtime = "auto"` without a `vllm` key serves with the embedded runtime (install.sh
    --runtime) where no container runtime and no other host vLLM is known; probed only then.
    The llama.cpp runtime's llama-server likewise (`with_llama_runtime`)."""
    from epycd.host.runtimes import embedded_vllm

    host = with_llama_runtime(host, llama_runtime_dir, specs, probe_llama)
    wants_auto = any(
        r.spec and r.spec.engine == "vllm" and r.spec.runtime == "auto" and not r.spec.vllm
        for r in specs
    )
    if not wants_auto or host.runtimes.vllm is not None or container_runtime(host.runtimes):
        return host
    vllm = embedded_vllm(runtime_dir)
    if vllm is None:
        return host
    runtimes = host.runtimes.model_copy(update={"vllm": probe(vllm)})
    return host.model_copy(update={"runtimes": runtimes})
