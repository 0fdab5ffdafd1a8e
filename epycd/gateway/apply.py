"""Putting the gateway in place: its approval, its files and its unit, and bringing the
routes and keys up to date after each change (docs/gateway.md, "Approval and updates").

The gateway is approved once (`epycctl gateway approve`): the admin sees its unit, where it
listens and what it routes. After that, its routes follow the approved endpoints and its
keys the key store without a new approval: `refresh` rewrites the files and reloads
HAProxy, which keeps every open connection and stream (master-worker reload). A change of
the content of a credential (the endpoints' own keys, the TLS certificate), which systemd
copies for HAProxy only when the unit starts, restarts it instead.

Every candidate is checked by HAProxy itself before anything of it is written
(epycd.gateway.check). Whether there is a gateway to update is decided from what is
installed (its approval record, its unit), not from epycd.conf alone: an installed gateway
is updated with the address and certificate it was approved with, whatever the settings
say now, and a unit without its record is an error naming the fix, so no change of keys
or routes is reported done while HAProxy goes on with the old ones.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from epycd import systemd
from epycd.approval.record import Approver, approved_names, current_approver, readable_approval
from epycd.atomic import make_dirs, unlink_durable, write_atomic
from epycd.errors import EpycError, InputError, Refusal
from epycd.gateway import values
from epycd.gateway.check import haproxy_check
from epycd.gateway.haproxy import GatewayFiles, gateway_files
from epycd.gateway.keys import KeyStore, read_store
from epycd.gateway.plan import GATEWAY, gateway_folder, plan_gateway
from epycd.gateway.routes import Route, Skipped
from epycd.gateway.unit import (
    ENDPOINT_KEYS_CREDENTIAL,
    ENDPOINT_KEYS_FILE,
    TLS_CREDENTIAL,
    UNIT,
    credential_path,
    render_unit,
)
from epycd.plan.placement.reservations import Reservations
from epycd.plan.service.secrets import read_root_only
from epycd.readfile import RECORD_MAX_BYTES, STATE_MAX_BYTES, read_bytes
from epycd.settings import Settings, parse_listen

FILE_MODE = 0o644
"""HAProxy, as the endpoints' user, reads them: they hold names, digests and limits, never a
key (`keys.map` holds SHA-256 digests of 256-bit random keys)."""
SECRET_MODE = 0o600
PEM_BLOCKS = ("CERTIFICATE-----", "PRIVATE KEY-----")
"""What HAProxy's `crt` needs in the one file: the certificate and its key (a cheap first
check for a better message; HAProxy's own check follows)."""
TLS_FILE = "tls.pem"


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


def tls_path(settings: Settings) -> Path:
    """epycd's checked copy of the certificate, root only: the file the unit loads."""
    return state_folder(settings) / TLS_FILE


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
        if values.SECRET.problem(key) is not None:
            reason = f"its key file {path} holds white space, nothing or more than 4096 bytes"
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
    check_reserved(settings)
    return settings.gateway_listen


def check_reserved(settings: Settings) -> None:
    """The gateway's ports against the address book's endpoint side: every port an approved
    endpoint holds (its own, its instances', its engine's), whether its units run or not."""
    approved = {}
    for name in approved_names(settings):
        approval = readable_approval(settings, name)
        if approval is not None:
            approved[name] = approval.plan
    held = Reservations.of(approved).listeners()
    for key in ("gateway_listen", "gateway_metrics_listen"):
        value = getattr(settings, key)
        holder = held.get(parse_listen(value)[1]) if value else None
        if holder is not None:
            raise InputError(
                f"port {parse_listen(value)[1]} of {value} is held by the {holder.reserved}",
                file=settings.daemon_conf,
                key=key,
                fix=f"give the gateway another port, or free this one ({holder.fix})",
            )


def overlapping(one: str, other: str) -> bool:
    """Two listen addresses on one port where one socket would take the other's."""
    if not one or not other:
        return False
    (address, port), (other_address, other_port) = parse_listen(one), parse_listen(other)
    ips = ipaddress.ip_address(address), ipaddress.ip_address(other_address)
    return port == other_port and (ips[0] == ips[1] or any(ip.is_unspecified for ip in ips))


@dataclass(frozen=True)
class Target:
    """Where the gateway listens and the certificate it serves: the settings' when it is
    approved, its approval record's when its routes or keys change after."""

    listen: str
    metrics_listen: str
    tls_cert_file: Path | None

    @staticmethod
    def of_settings(settings: Settings) -> Target:
        return Target(
            check_listen(settings),
            settings.gateway_metrics_listen,
            settings.gateway_tls_cert_file,
        )

    @staticmethod
    def of_approval(approval: GatewayApproval) -> Target:
        cert = approval.tls_cert_file
        return Target(approval.listen, approval.metrics_listen, Path(cert) if cert else None)


def read_certificate(settings: Settings, cert: Path | None) -> str | None:
    """The TLS certificate file's text, readable and root-only with a certificate and a
    private key in it, or an error naming it; None without TLS."""
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
    return text + "\n"


def check_certificate(settings: Settings) -> Path | None:
    """The settings' TLS certificate file, after `read_certificate`'s checks."""
    read_certificate(settings, settings.gateway_tls_cert_file)
    return settings.gateway_tls_cert_file


@dataclass(frozen=True)
class Candidate:
    """What the gateway would be: its target, its routes and clients, the endpoints' keys
    and the certificate's text; rendered for any folder (HAProxy's check renders it into
    a temporary one)."""

    target: Target
    routes: list[Route]
    store: KeyStore
    endpoint_keys: dict[str, str]
    tls: str | None
    skipped: list[Skipped] = field(default_factory=list)

    def files(self, folder: Path) -> GatewayFiles:
        return gateway_files(
            self.routes,
            self.store,
            listen=self.target.listen,
            metrics_listen=self.target.metrics_listen,
            folder=folder,
            endpoint_keys=self.endpoint_keys,
            endpoint_keys_path=credential_path(ENDPOINT_KEYS_CREDENTIAL),
            tls_cert=credential_path(TLS_CREDENTIAL) if self.tls is not None else None,
        )

    def credentials(self, files: GatewayFiles) -> dict[str, str]:
        """The unit's credentials by name, as `LoadCredential=` hands them over."""
        held = {ENDPOINT_KEYS_CREDENTIAL: files.endpoint_keys}
        if self.tls is not None:
            held[TLS_CREDENTIAL] = self.tls
        return held


def candidate(settings: Settings, target: Target, store: KeyStore | None = None) -> Candidate:
    """The gateway for `target` with the approved endpoints and `store` (the key store's
    keys when None), checked by HAProxy itself (epycd.gateway.check): a `Refusal` with its
    lines when it would not start on it. Nothing is written."""
    routes, keys, skipped = endpoint_keys(plan_gateway(settings).routes)
    tls = read_certificate(settings, target.tls_cert_file)
    clients = store if store is not None else read_store(settings)
    made = Candidate(target, routes, clients, keys, tls, skipped)
    shown = {TLS_CREDENTIAL: str(target.tls_cert_file)} if tls is not None else {}
    credentials = made.credentials(made.files(gateway_folder(settings)))
    haproxy_check(settings.gateway_haproxy, made.files, credentials, shown=shown)
    return made


def unit_text(settings: Settings, target: Target | None = None) -> str:
    target = target or Target.of_settings(settings)
    return render_unit(
        haproxy=settings.gateway_haproxy,
        listen=target.listen,
        metrics_listen=target.metrics_listen,
        config_file=gateway_folder(settings) / "haproxy.cfg",
        tls_cert_file=tls_path(settings) if target.tls_cert_file is not None else None,
        endpoint_keys_file=endpoint_keys_path(settings),
    )


def write_files(settings: Settings, made: Candidate) -> bool:
    """Write what changed; True when a credential's content changed (the endpoints' keys or
    the certificate): systemd copies those only when the unit starts, so that is a
    restart's worth, where the rest is a reload's."""
    folder = gateway_folder(settings)
    files = made.files(folder)
    make_dirs(folder)
    for name, text in files.files().items():
        _write_if_changed(folder / name, text, FILE_MODE)
    changed = _write_if_changed(endpoint_keys_path(settings), files.endpoint_keys, SECRET_MODE)
    if made.tls is not None:
        changed = _write_if_changed(tls_path(settings), made.tls, SECRET_MODE) or changed
    elif tls_path(settings).exists():
        unlink_durable(tls_path(settings))  # no TLS any more: no key left behind
    return changed


def _write_if_changed(path: Path, text: str, mode: int) -> bool:
    """Write `text` unless the file holds it already (by digest); True when written."""
    wanted = hashlib.sha256(text.encode()).digest()
    try:
        if hashlib.sha256(read_bytes(path, RECORD_MAX_BYTES)).digest() == wanted:
            return False
    except OSError:
        pass  # absent, or not a file epycd wrote: written anew
    write_atomic(path, text.encode(), mode)
    return True


def approve(settings: Settings, *, start: bool) -> list[str]:
    """Check the gateway with HAProxy, then write the files, the unit and the record; enable
    the unit and (unless `start` is False) start it, restart it for a new unit or a
    credential's new content, or reload it. The steps taken, for the person. A missing
    address, an unreadable certificate or a configuration HAProxy refuses is an error
    before anything is written."""
    target = Target.of_settings(settings)
    made = candidate(settings, target)
    unit = unit_text(settings, target)
    cert = settings.gateway_tls_cert_file
    previous = read_approval(settings)
    credentials_changed = write_files(settings, made)
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
    if same_unit and not credentials_changed and systemd.is_active(UNIT) == "active":
        systemd.systemctl("reload", UNIT)
        steps.append(f"reloaded {UNIT}")
    else:
        systemd.restart([UNIT])
        steps.append(f"started {UNIT}")
    return steps


def installed_target(settings: Settings) -> Target | None:
    """The installed gateway's approved target; None when no gateway is installed; a
    `Refusal` naming the fix for a unit whose approval record is gone."""
    approval = read_approval(settings)
    if approval is not None:
        return Target.of_approval(approval)
    if unit_path(settings).exists():
        raise Refusal(
            f"{unit_path(settings)} is installed but the gateway's approval record "
            f"{approval_path(settings)} is missing, so its routes and keys cannot be updated",
            fix="`epycctl gateway approve` puts the gateway back in place, "
            "`epycctl gateway remove` takes it away",
        )
    return None


def prepare(settings: Settings, store: KeyStore | None = None) -> Candidate | None:
    """The installed gateway's update to the approved endpoints and `store` (the key
    store's keys when None), checked by HAProxy; None when no gateway is installed. Nothing
    is written: a caller checks first and writes its own change after."""
    target = installed_target(settings)
    return None if target is None else candidate(settings, target, store)


def put_in_place(settings: Settings, made: Candidate, *, reload: bool = True) -> str:
    """Write `made` (from `prepare`) and reload HAProxy, or restart it when a credential's
    content changed; what was done. Errors propagate."""
    changed = write_files(settings, made)
    note = _settings_note(settings, made.target)
    if not reload:
        return "gateway: routes and keys written (systemd not touched)" + note
    if systemd.is_active(UNIT) not in ("active", "reloading"):
        return "gateway: routes and keys written (it is not running)" + note
    if changed:
        systemd.restart([UNIT])
        return "gateway: restarted for a credential's new content (endpoint keys or TLS)" + note
    systemd.systemctl("reload", UNIT)
    return "gateway: routes and keys reloaded" + note


def _settings_note(settings: Settings, target: Target) -> str:
    if not settings.gateway_listen:
        return (
            f" (gateway_listen is no longer set in {settings.daemon_conf}: the installed "
            f"gateway stays on its approved {target.listen}; `epycctl gateway remove` takes "
            "it away)"
        )
    now = (settings.gateway_listen, settings.gateway_metrics_listen, settings.gateway_tls_cert_file)
    if now != (target.listen, target.metrics_listen, target.tls_cert_file):
        return (
            f" (the gateway settings in {settings.daemon_conf} differ from the approved ones: "
            "`epycctl gateway approve` applies them)"
        )
    return ""


def refresh(settings: Settings, *, reload: bool = True) -> str | None:
    """After an endpoint's approval or removal: the routes and keys brought up to date and
    (with `reload`) HAProxy reloaded, when a gateway is installed; what was done, or None
    when there is none. Never raises: the change that called it stands, and a failure here
    is said, not fatal."""
    try:
        made = prepare(settings)
        return None if made is None else put_in_place(settings, made, reload=reload)
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
