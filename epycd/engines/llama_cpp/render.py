"""llama.cpp's units: llama-server on the host under the supervisor, pinned and sandboxed
as a host vLLM is (`epycd.render.services.host_unit`), after its decisions are checked:
identity, pinning, executable, secret files, and one thread per pinned core (rule 10)."""

from __future__ import annotations

from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.plan.model import AnyServer
from epycd.render.policy import (
    check_cpus_and_nodes,
    check_identity,
    check_plain_path,
    refuse,
    secret_files,
)
from epycd.render.server import ServerRenderer
from epycd.render.services import host_unit
from epycd.render.syntax import executable


def _llama(decisions: AnyServer) -> LlamaServer:
    assert isinstance(decisions, LlamaServer), decisions.kind
    return decisions


class LlamaRenderer(ServerRenderer):
    engine = "llama.cpp"

    def check(self, decisions: AnyServer) -> None:
        llama = _llama(decisions)
        check_identity(llama)
        cpus = check_cpus_and_nodes(llama)
        executable(llama.llama_server, "llama_server")
        if llama.runtime != "host":
            raise refuse(llama, "runtime", "llama-server runs on the host", "plan again")
        if llama.invocation.threads != len(cpus):
            raise refuse(
                llama,
                "threads",
                f"{llama.invocation.threads} threads on {len(cpus)} pinned cores",
                "plan the endpoint again",
            )
        for key, secret in secret_files(llama):
            check_plain_path(llama, key, secret)

    def unit_text(self, decisions: AnyServer) -> str:
        llama = _llama(decisions)
        return host_unit(llama, [llama.llama_server, *llama.server_args])


RENDERER = LlamaRenderer()
