"""vLLM's units: a CPU endpoint's decisions checked by `epycd.render.policy`, an Instinct
one's by `epycd.render.gpu`; a Quadlet `.container` for podman (`epycd.render.quadlet`), a
`.service` running `docker run` or the host's `vllm serve` under the supervisor
(`epycd.render.services`)."""

from __future__ import annotations

from epycd.engines.vllm.plan.model import VllmCpuEndpoint, VllmInstinctEndpoint, VllmServerEndpoint
from epycd.plan.model import ServerEndpoint
from epycd.render import commands
from epycd.render.gpu import check_gpu_decisions
from epycd.render.policy import check_decisions
from epycd.render.quadlet import render_container
from epycd.render.server import ServerRenderer
from epycd.render.services import host_unit, render_docker


def _vllm(decisions: ServerEndpoint) -> VllmServerEndpoint:
    assert isinstance(decisions, VllmCpuEndpoint | VllmInstinctEndpoint), decisions.kind
    return decisions


class VllmRenderer(ServerRenderer):
    engine = "vllm"

    def check(self, decisions: ServerEndpoint) -> None:
        vllm = _vllm(decisions)
        if isinstance(vllm, VllmInstinctEndpoint):
            check_gpu_decisions(vllm)
        else:
            check_decisions(vllm)

    def unit_text(self, decisions: ServerEndpoint) -> str:
        vllm = _vllm(decisions)
        if vllm.runtime == "podman":
            return render_container(vllm)
        if vllm.runtime == "docker":
            return render_docker(vllm)
        return host_unit(vllm, commands.vllm_serve_on_host(vllm))


RENDERER = VllmRenderer()
