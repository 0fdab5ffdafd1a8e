"""Putting the gateway in place: its approval, its files and its unit, and bringing the
routes and keys up to date after each change (docs/gateway.md, "Approval and updates").

The gateway is approved once (`epycctl gateway approve`): the admin sees its unit, where it
listens and what it routes. After that, its routes follow the approved endpoints and its
keys the key store without a new approval: `refresh` rewrites the files and reloads
HAProxy, which keeps every open connection and stream (master-worker reload). A change of
the endpoints' own keys, which HAProxy gets as a credential, restarts it instead.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from epycd import systemd
from epycd.approval.record import Approver, current_approver
from epycd.atomic import make_dirs, unlink_durable, write_atomic
from epycd.errors import EpycError, InputError
from epycd.gateway.haproxy import GatewayFiles, gateway_files
from epycd.gateway.keys import read_store
from epycd.gateway.plan import GATEWAY, GatewayPlan, gateway_folder, plan_gateway
from epycd.gateway.routes import Route, Skipped
from epycd.gateway.unit import (
    ENDPOINT_KEYS_CREDENTIAL,
    ENDPOINT_KEYS_FILE,
    TLS_CREDENTIAL,
    UNIT,
    credential_path,
    render_unit,
)
from epycd.plan.service.secrets import read_root_only
from epycd.readfile import RECORD_MAX_BYTES, STATE_MAX_BYTES, read_bytes
from epycd.settings import Settings, parse_listen

FILE_MODE = 0o644
"""HAProxy, as the endpoints' user, reads them: they hold names, digests and limits, never a
key (`keys.map` holds SHA-256 digests of 256-bit random keys)."""
SECRET_MODE = 0o600
PEM_BLOCKS = ("CERTIFICATE-----", "PRIVATE KEY-----")
"""What HAProxy's `crt` needs in the one file: the certificate and its key."""


class GatewayApproval(BaseModel):
    approved_at: datetime
    approver: Approver
    listen: str
    metrics_listen: str = ""
    tls_cert_file: str | None
    unit_sha256: str


def state_folder(settings: Settings) -> Path:
    return settings.state_dir / GATEWAY


def approval_path(settings: Settings) -> Path:
    return state_folder(settings) / "approval.json"


def endpoint_keys_path(settings: Settings) -> Path:
    return state_folder(settings) / ENDPOINT_KEYS_FILE


def unit_path(settings: Settings) -> Path:
    return settings.unit_dir / UNIT


def read_approval(settings: Settings) -> GatewayApproval | None:
    try:
        raw = read_bytes(approval_path(settings), STATE_MAX_BYTES)
    except FileNotFoundError:
        return None
    return GatewayApproval.model_validate_json(raw)


def endpoint_keys(routes: list[Route]) -> tuple[list[Route], dict[str, str], list[Skipped]]:
    """The routes the gateway can serve, the keys of those that need one, and the routes
    left out because their key file cannot be read (that endpoint alone)."""
    served, keys, skipped = [], {}, []
    for route in routes:
        if route.api_key_file is None:
            served.append(route)
            continue
        path = Path(route.api_key_file)
        try:
            key = read_root_only(path, path, "api_key_file", "the endpoint's API key")
        except InputError as exc:
            skipped.append(Skipped(endpoint=route.endpoint, reason=f"its key: {exc}"))
            continue
        if not key or any(c.isspace() for c in key):
            reason = f"its key file {path} holds white space or nothing"
            skipped.append(Skipped(endpoint=route.endpoint, reason=reason))
            continue
        served.append(route)
        keys[route.endpoint] = key
    return served, keys, skipped


def check_listen(settings: Settings) -> str:
    if not settings.gateway_listen:
        raise InputError(
            "no gateway address is set",
            file=settings.daemon_conf,
            key="gateway_listen",
            fix='set gateway_listen = "127.0.0.1:8080" (or another ADDRESS:PORT) in it',
        )
    if overlapping(settings.gateway_listen, settings.gateway_metrics_listen):
        raise InputError(
            f"the gateway's metrics ({settings.gateway_metrics_listen}) would listen where the "
            f"gateway does ({settings.gateway_listen})",
            file=settings.daemon_conf,
            key="gateway_metrics_listen",
            fix='give it another port (default "127.0.0.1:9465"), or "" for no metrics',
        )
    return settings.gateway_listen


def overlapping(one: str, other: str) -> bool:
    """Two listen addresses on one port where one socket would take the other's."""
    if not one or not other:
        return False
    (address, port), (other_address, other_port) = parse_listen(one), parse_listen(other)
    ips = ipaddress.ip_address(address), ipaddress.ip_address(other_address)
    return port == other_port and (ips[0] == ips[1] or any(ip.is_unspecified for ip in ips))


def check_certificate(settings: Settings) -> Path | None:
    """The TLS certificate file, readable and root-only, or an error naming it."""
    cert = settings.gateway_tls_cert_file
    if cert is None:
        return None
    key = "gateway_tls_cert_file"
    text = read_root_only(cert, settings.daemon_conf, key, "the gateway's key")
    missing = [block for block in PEM_BLOCKS if block not in text]
    if missing:
        raise InputError(
            f"{cert} holds no {' and no '.join(missing)}",
            file=settings.daemon_conf,
            key=key,
            fix="give one PEM file with the certificate, its chain and its private key "
            "(cat cert.pem chain.pem key.pem)",
        )
    return cert


def render(settings: Settings, planned: GatewayPlan) -> tuple[GatewayFiles, list[Skipped]]:
    routes, keys, skipped = endpoint_keys(planned.routes)
    cert = settings.gateway_tls_cert_file
    files = gateway_files(
        routes,
        read_store(settings),
        listen=check_listen(settings),
        metrics_listen=settings.gateway_metrics_listen,
        folder=gateway_folder(settings),
        endpoint_keys=keys,
        endpoint_keys_path=credential_path(ENDPOINT_KEYS_CREDENTIAL),
        tls_cert=credential_path(TLS_CREDENTIAL) if cert is not None else None,
    )
    return files, skipped


def unit_text(settings: Settings) -> str:
    return render_unit(
        listen=check_listen(settings),
        metrics_listen=settings.gateway_metrics_listen,
        config_file=gateway_folder(settings) / "haproxy.cfg",
        tls_cert_file=settings.gateway_tls_cert_file,
        endpoint_keys_file=endpoint_keys_path(settings),
    )


def write_files(settings: Settings, files: GatewayFiles) -> bool:
    """Write what changed; True when the endpoints' keys changed (a restart's worth)."""
    folder = gateway_folder(settings)
    make_dirs(folder)
    for name, text in files.files().items():
        _write_if_changed(folder / name, text, FILE_MODE)
    return _write_if_changed(endpoint_keys_path(settings), files.endpoint_keys, SECRET_MODE)


def _write_if_changed(path: Path, text: str, mode: int) -> bool:
    try:
        if read_bytes(path, RECORD_MAX_BYTES) == text.encode():
            return False
    except FileNotFoundError:
        pass
    write_atomic(path, text.encode(), mode)
    return True


def approve(settings: Settings, *, start: bool) -> list[str]:
    """Write the files, the unit and the record; enable the unit and (unless `start` is
    False) start it, restart it for a new unit or new endpoint keys, or reload it. The
    steps taken, for the person. A missing address or an unreadable certificate is an error
    before anything is written."""
    check_listen(settings)
    check_certificate(settings)
    files, _ = render(settings, plan_gateway(settings))
    unit = unit_text(settings)
    cert = settings.gateway_tls_cert_file
    previous = read_approval(settings)
    keys_changed = write_files(settings, files)
    write_atomic(unit_path(settings), unit.encode(), 0o644)
    record = GatewayApproval(
        approved_at=datetime.now(UTC),
        approver=current_approver(),
        listen=settings.gateway_listen,
        metrics_listen=settings.gateway_metrics_listen,
        tls_cert_file=str(cert) if cert is not None else None,
        unit_sha256=hashlib.sha256(unit.encode()).hexdigest(),
    )
    text = json.dumps(record.model_dump(mode="json"), indent=2) + "\n"
    write_atomic(approval_path(settings), text.encode(), 0o644)
    steps = [f"wrote {unit_path(settings)} and the files in {gateway_folder(settings)}"]
    systemd.daemon_reload()
    systemd.enable([UNIT])
    steps.append(f"enabled {UNIT}: it starts at boot")
    if not start:
        return steps
    same_unit = previous is not None and previous.unit_sha256 == record.unit_sha256
    if same_unit and not keys_changed and systemd.is_active(UNIT) == "active":
        systemd.systemctl("reload", UNIT)
        steps.append(f"reloaded {UNIT}")
    else:
        systemd.restart([UNIT])
        steps.append(f"started {UNIT}")
    return steps


def refresh(settings: Settings, *, reload: bool = True) -> str | None:
    """After an endpoint's approval or removal, or a key's: the routes and keys brought up
    to date and (with `reload`) HAProxy reloaded, when the gateway is approved; what was
    done, or None when there is no gateway. Never raises: the change that called it stands,
    and a failure here is said, not fatal."""
    try:
        if read_approval(settings) is None or not settings.gateway_listen:
            return None
        files, _ = render(settings, plan_gateway(settings))
        keys_changed = write_files(settings, files)
        if not reload:
            return "gateway: routes and keys written (systemd not touched)"
        if systemd.is_active(UNIT) not in ("active", "reloading"):
            return "gateway: routes and keys written (it is not running)"
        if keys_changed:
            systemd.restart([UNIT])
            return "gateway: restarted for the endpoints' new keys"
        systemd.systemctl("reload", UNIT)
        return "gateway: routes and keys reloaded"
    except (EpycError, OSError) as exc:
        return f"gateway: not updated: {exc} (run `epycctl gateway approve` again)"


def remove(settings: Settings) -> list[str]:
    steps = []
    if unit_path(settings).exists():
        systemd.disable([UNIT])
        systemd.stop([UNIT])
        unlink_durable(unit_path(settings))
        systemd.daemon_reload()
        steps.append(f"stopped, disabled and deleted {UNIT}")
    unlink_durable(approval_path(settings))
    return steps
