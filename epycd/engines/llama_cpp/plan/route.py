"""A llama.cpp endpoint's route: llama-server on the host, the one the endpoint file names
(`llama_server`) or the llama.cpp runtime's (install.sh --engine llama.cpp), probed only
when an endpoint asks for it (`with_llama_runtime`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from epycd.engines.llama_cpp import EMBEDDED_RUNTIME, LLAMA_CPP, install_command
from epycd.engines.llama_cpp.spec import LlamaKeys
from epycd.errors import InputError, Refusal
from epycd.host.facts import HostFacts, ServerFacts
from epycd.plan.route import EngineRoute, refuse_non_epyc
from epycd.spec import EndpointSpec, SpecResult

ENGINE = LLAMA_CPP.name
LlamaProber = Callable[[str], ServerFacts]
"""A llama-server executable -> what it is (`epycd.engines.llama_cpp.host.probe_llama_server`)."""

LLAMA_RUNTIME_FIX = (
    f"build llama-server for this CPU ({install_command(EMBEDDED_RUNTIME)}), "
    "or set llama_server = the path of a llama-server of your own"
)


class LlamaRoute(EngineRoute):
    """llama-server on the host, the runtime's or the file's."""

    engine: Literal["llama.cpp"] = "llama.cpp"
    runtime: Literal["host"] = "host"
    llama_server: str
    llama_version: str

    def json_keys(self) -> dict[str, Any]:
        """Its keys of `plan --json` (its vLLM keys stay null)."""
        return super().json_keys() | {
            "engine": self.engine,
            "llama_server": self.llama_server,
            "llama_version": self.llama_version,
        }

    def path_row(self) -> tuple[str, str]:
        return ("Path", f"host llama-server ({self.llama_server})")


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
    from epycd.engines.llama_cpp.host import embedded_llama_server

    wanted = any(
        r.spec and r.spec.engine == ENGINE and not LlamaKeys.of(r.spec).llama_server for r in specs
    )
    server = embedded_llama_server(runtime_dir) if wanted else None
    if server is None:
        return host
    servers = {**host.runtimes.servers, ENGINE: probe(server)}
    runtimes = host.runtimes.model_copy(update={"servers": servers})
    return host.model_copy(update={"runtimes": runtimes})
