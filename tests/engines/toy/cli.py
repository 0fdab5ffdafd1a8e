"""The toy engine's endpoints in `epycctl plan`."""

from __future__ import annotations

from typing import Any

from epycd.cli.engine_view import PlanView, Row, instances_json
from epycd.host.cpulist import parse_cpulist
from epycd.plan.endpoint import EndpointDecisions
from epycd.plan.model import AnyServer
from tests.engines.toy.plan.model import ToyServer


def _server(server: AnyServer) -> ToyServer:
    assert isinstance(server, ToyServer), server.kind
    return server


class ToyView(PlanView):
    engine = "toy"

    def json_keys(self, decided: EndpointDecisions, dumped: dict[str, Any]) -> dict[str, Any]:
        if decided.instances is not None:
            return {"instances": instances_json(decided)}
        return {"memory": dumped["fit"]}

    def backend_text(self, decided: EndpointDecisions) -> str:
        return "toy (a stand-in server)"

    def path_text(self, decided: EndpointDecisions) -> str:
        return "host"

    def endpoint_rows(self, decided: EndpointDecisions) -> list[Row]:
        return list(self.server_rows(decided.first))

    def server_rows(self, server: AnyServer) -> tuple[Row, Row, Row]:
        toy = _server(server)
        return (
            ("Memory fit", f"required {toy.fit.required_gb} GB of {toy.fit.available_gb} GB"),
            ("CPU config", f"socket {toy.socket}, pinned {toy.cpus}"),
            ("Context", f"{toy.slots} slots of {toy.context} tokens"),
        )

    def member_text(self, member: AnyServer) -> tuple[str, str]:
        toy = _server(member)
        return f"{len(parse_cpulist(toy.cpus))} cores", f"{toy.slots} slots"


VIEW = ToyView()
