"""vLLM's units (`RENDERER`): a CPU endpoint's decisions checked by `policy.py`, an
Instinct one's by `gpu.py`; a Quadlet `.container` for podman (`quadlet.py`), a `.service`
running `docker run` (`docker.py`) or the host's `vllm serve` under the supervisor
(`epycd.render.services`' `host_unit`); the argument vectors they run (`commands.py`)."""

from __future__ import annotations

from epycd.engines.vllm.plan.model import AnyVllmServer, VllmCpuServer, VllmInstinctServer
from epycd.engines.vllm.render.commands import vllm_serve_on_host
from epycd.engines.vllm.render.docker import render_docker
from epycd.engines.vllm.render.gpu import check_gpu_decisions
from epycd.engines.vllm.render.policy import check_decisions
from epycd.engines.vllm.render.quadlet import render_container
from epycd.plan.model import AnyServer
from epycd.render.server import ServerRenderer
from epycd.render.services import host_unit


def _vllm(decisions: AnyServer) -> AnyVllmServer:
    assert isinstance(decisions, VllmCpuServer | VllmInstinctServer), decisions.kind
    return decisions


class VllmRenderer(ServerRenderer):
    engine = "vllm"

    def check(self, decisions: AnyServer) -> None:
        vllm = _vllm(decisions)
        if isinstance(vllm, VllmInstinctServer):
            check_gpu_decisions(vllm)
        else:
            check_decisions(vllm)

    def unit_text(self, decisions: AnyServer) -> str:
        vllm = _vllm(decisions)
        if vllm.runtime == "podman":
            return render_container(vllm)
        if vllm.runtime == "docker":
            return render_docker(vllm)
        return host_unit(vllm, vllm_serve_on_host(vllm))


RENDERER = VllmRenderer()
