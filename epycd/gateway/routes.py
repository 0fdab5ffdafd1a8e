"""What the gateway routes: one route per approved endpoint, from its approval record
(docs/gateway.md, "Routes").

A route is the endpoint's served model name, where the gateway reaches it (its own address,
or loopback for one that listens on every address) and the root-only file of the key it
requires. An endpoint whose model name the gateway cannot route (a name HAProxy's maps
cannot hold, one another endpoint serves already) is left out with the reason, and the
others are routed: one endpoint's record never stops the gateway of the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from epycd.approval.record import Approval
from epycd.gateway.keys import MODEL_NAME, MODEL_NAME_FIX
from epycd.health import PrimaryEndpoint
from epycd.listen import local_address


class Route(BaseModel):
    model_config = ConfigDict(frozen=True)

    endpoint: str
    model: str
    primary_endpoint: PrimaryEndpoint
    address: str
    """host:port the gateway connects to (an IPv6 address in brackets)."""
    api_key_file: str | None = None

    @property
    def backend(self) -> str:
        """HAProxy's name of the route's backend: the endpoint name, a unique name already."""
        return f"endpoint-{self.endpoint}"


class Skipped(BaseModel):
    endpoint: str
    reason: str


def route_of(approval: Approval) -> Route:
    decisions = approval.plan.decisions
    return Route(
        endpoint=approval.endpoint,
        model=decisions.served_model_name,
        primary_endpoint=decisions.primary_endpoint,
        address=f"{local_address(decisions.host)}:{decisions.port}",
        api_key_file=decisions.api_key_file,
    )


def routes_of(approvals: list[Approval]) -> tuple[list[Route], list[Skipped]]:
    """The routes of the approved endpoints in name order, and those left out with why. Of
    two endpoints serving one model name the first by name keeps it."""
    routes: dict[str, Route] = {}
    skipped = []
    for approval in sorted(approvals, key=lambda a: a.endpoint):
        route = route_of(approval)
        if MODEL_NAME.fullmatch(route.model) is None:
            reason = f"its model name {route.model!r} cannot be routed ({MODEL_NAME_FIX})"
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
        elif route.model in routes:
            holder = routes[route.model].endpoint
            reason = f"endpoint {holder} serves the model name {route.model!r} already"
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
        else:
            routes[route.model] = route
    return list(routes.values()), skipped
