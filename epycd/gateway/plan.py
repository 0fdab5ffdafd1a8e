"""What the gateway would serve now: its address, its routes (one per approved endpoint),
the endpoints it leaves out and why, and its clients. Read from the approval records and
the key store; nothing is written."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from epycd.approval.record import approved_names, readable_approval
from epycd.gateway.keys import read_store
from epycd.gateway.routes import Route, Skipped, routes_of
from epycd.settings import Settings

GATEWAY = "gateway"
"""Its folder under the state folder, and its unit's stem after the product's prefix."""


class GatewayPlan(BaseModel):
    listen: str
    tls_cert_file: str | None
    folder: str
    routes: list[Route]
    skipped: list[Skipped]
    clients: list[str] | None
    """The clients' names; None for a caller who may not read the key store (root only)."""


def gateway_folder(settings: Settings) -> Path:
    """Where its HAProxy configuration and maps are written."""
    return settings.state_dir / GATEWAY / "haproxy"


def plan_gateway(settings: Settings) -> GatewayPlan:
    approvals = []
    skipped = []
    for name in approved_names(settings):
        approval = readable_approval(settings, name)
        if approval is None:
            reason = "its approval record cannot be read (`epycctl status` says why)"
            skipped.append(Skipped(endpoint=name, reason=reason))
        else:
            approvals.append(approval)
    routes, unroutable = routes_of(approvals)
    tls = settings.gateway_tls_cert_file
    return GatewayPlan(
        listen=settings.gateway_listen,
        tls_cert_file=str(tls) if tls is not None else None,
        folder=str(gateway_folder(settings)),
        routes=routes,
        skipped=sorted([*skipped, *unroutable], key=lambda s: s.endpoint),
        clients=client_names(settings),
    )


def client_names(settings: Settings) -> list[str] | None:
    try:
        return [client.name for client in read_store(settings).keys]
    except PermissionError:
        return None
