"""The toy engine's units: its stand-in server on the host under epycd's supervisor, pinned
and sandboxed by the core's host unit, after the core's checks of identity and pinning."""

from __future__ import annotations

from epycd.plan.model import AnyServer
from epycd.render.policy import check_cpus_and_nodes, check_identity, check_plain_path, secret_files
from epycd.render.server import ServerRenderer
from epycd.render.services import host_unit
from tests.engines.toy.plan.model import ToyServer


def _toy(decisions: AnyServer) -> ToyServer:
    assert isinstance(decisions, ToyServer), decisions.kind
    return decisions


class ToyRenderer(ServerRenderer):
    engine = "toy"

    def check(self, decisions: AnyServer) -> None:
        toy = _toy(decisions)
        check_identity(toy)
        check_cpus_and_nodes(toy)
        for key, secret in secret_files(toy):
            check_plain_path(toy, key, secret)

    def unit_text(self, decisions: AnyServer) -> str:
        toy = _toy(decisions)
        return host_unit(toy, [toy.product_python, *toy.server_args])


RENDERER = ToyRenderer()
