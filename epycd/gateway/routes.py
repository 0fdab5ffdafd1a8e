"""What the gateway routes: one route per approved endpoint, from its approval record
(docs/gateway.md, "Routes").

A route is the endpoint's served model name and its aliases (the endpoint file's
`aliases`), where the gateway reaches it (its own address, or loopback for one that listens
on every address) and the root-only file of the key it requires. An endpoint whose model
name the gateway cannot route (a name HAProxy's maps cannot hold, one another endpoint
serves already) is left out with the reason, and an alias another endpoint's name or alias
took first is left out alone: one endpoint's record never stops the gateway of the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from epycd.approval.record import Approval
from epycd.gateway import values
from epycd.health import PrimaryEndpoint
from epycd.listen import local_address
from epycd.names import MODEL_NAME, MODEL_NAME_FIX


class Route(BaseModel):
    model_config = ConfigDict(frozen=True)

    endpoint: str
    model: str
    aliases: list[str] = []
    """More names routed to the endpoint, each checked (`MODEL_NAME`) and unique."""
    primary_endpoint: PrimaryEndpoint
    address: str
    """host:port the gateway connects to (an IPv6 address in brackets)."""
    api_key_file: str | None = None
    on_demand: bool = Field(default=False, exclude_if=lambda on_demand: not on_demand)
    """Its port is a socket that starts the engine (docs/on-demand.md): the gateway never
    checks it, since a check would start it."""

    @property
    def backend(self) -> str:
        """HAProxy's name of the route's backend: the endpoint name, a unique name already."""
        return f"endpoint-{self.endpoint}"

    @property
    def names(self) -> list[str]:
        """Every name the route answers to, its model's first."""
        return [self.model, *self.aliases]


class Skipped(BaseModel):
    endpoint: str
    reason: str


def route_of(approval: Approval) -> Route:
    decisions = approval.plan.decisions
    return Route(
        endpoint=approval.endpoint,
        model=decisions.served_model_name,
        aliases=list(decisions.model_aliases),
        primary_endpoint=decisions.primary_endpoint,
        address=f"{local_address(decisions.host)}:{decisions.port}",
        api_key_file=decisions.api_key_file,
        on_demand=decisions.on_demand is not None,
    )


def routes_of(approvals: list[Approval]) -> tuple[list[Route], list[Skipped]]:
    """The routes of the approved endpoints in name order, and those left out with why. Of
    two endpoints serving one model name the first by name keeps it; every served model
    name is routed before any alias, so an alias never takes another endpoint's model name.
    An alias left out is said as a `Skipped` of its endpoint, whose route stays."""
    routes: list[Route] = []
    holders: dict[str, str] = {}
    skipped = []
    candidates = [route_of(a) for a in sorted(approvals, key=lambda a: a.endpoint)]
    for route in candidates:
        if MODEL_NAME.fullmatch(route.model) is None:
            reason = f"its model name {route.model!r} cannot be routed ({MODEL_NAME_FIX})"
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
        elif (problem := values.ADDRESS.problem(route.address)) is not None:
            reason = f"its address cannot be routed: {problem}"
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
        elif route.model in holders:
            holder = holders[route.model]
            reason = f"endpoint {holder} serves the model name {route.model!r} already"
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
        else:
            holders[route.model] = route.endpoint
            routes.append(route)
    routed = []
    for route in routes:
        aliases = []
        for alias in route.aliases:
            if MODEL_NAME.fullmatch(alias) is None:
                reason = f"its alias {alias!r} cannot be routed ({MODEL_NAME_FIX})"
            elif alias in holders:
                reason = f"its alias {alias!r} is endpoint {holders[alias]}'s name already"
            else:
                holders[alias] = route.endpoint
                aliases.append(alias)
                continue
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
        routed.append(route.model_copy(update={"aliases": aliases}))
    return routed, skipped
