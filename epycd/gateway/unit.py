"""The gateway's unit, `epyc-llm-gateway.service`: Debian's HAProxy in master-worker mode
with systemd's notify support (`-Ws`), reading the configuration and maps epyc-llm writes to
its folder (epycd.gateway.plan.gateway_folder).

Routes and keys change without a new approval (docs/gateway.md, "Approval and updates"):
the files are rewritten and HAProxy reloads (`ExecReload=`: SIGUSR2 to the master, which
starts new workers on the new files while the old ones finish their requests and streams,
having handed the limits' counts over through a socket in `RuntimeDirectory=`; on a
configuration it refuses, the old workers go on serving). No `haproxy -c` runs before
the reload: systemd 252 does not give `ExecReload=` the credentials under a mount namespace
(github.com/systemd/systemd/issues/35227), so the check would fail on every gateway with
TLS or endpoint keys; epycctl checks each candidate with `haproxy -c` before it installs it
instead (epycd.gateway.check). The
secrets do not sit in those files: the TLS certificate and the endpoints' own keys come as
credentials (`LoadCredential=`, root-only files systemd copies into the service's
credentials folder when it starts, and not again at a reload: systemd refreshes them on
reload only from version 259 on, github.com/systemd/systemd/pull/40093), so a change of
either's content restarts the gateway instead. The unit loads epycd's checked copy of the
certificate (`STATE_DIR/gateway/tls.pem`), never the admin's file itself, so the gateway
only ever starts on a certificate `haproxy -c` accepted.

It runs as the endpoints' user (`epyc-llm`), in their sandbox, without netlink. Unlike a
set's balancer it has no loopback-only address filter: it reaches each endpoint where that
listens, any address of this host, and routes change without a new unit.
"""

from __future__ import annotations

from pathlib import Path

from epycd.render.sandbox import COMMON_SANDBOX, PRODUCT_USER
from epycd.render.syntax import command_line, plain_value
from epycd.render.text import Line
from epycd.settings import parse_listen

HAPROXY = "/usr/sbin/haproxy"
UNIT = "epyc-llm-gateway.service"
TLS_CREDENTIAL = "tls.pem"
ENDPOINT_KEYS_CREDENTIAL = "endpoint-keys.map"
ENDPOINT_KEYS_FILE = "endpoint-keys.map"
"""The endpoints' own keys, root only, beside (not in) the folder HAProxy reads."""
RESTART_S = 2
LOW_PORTS = 1024
RUNTIME_DIRECTORY = "epyc-llm-gateway"
"""/run/epyc-llm-gateway, the user's alone: the socket where the old workers hand the
limits' counts to the new ones at a reload (epycd.gateway.haproxy.PEER_SOCKET); it lasts
from the start to the stop, reloads included."""


OWN_LINES = frozenset({"RestrictAddressFamilies", "CapabilityBoundingSet", "AmbientCapabilities"})
"""The endpoints' sandbox lines the gateway sets its own way."""


def port_lines(port: int) -> list[Line]:
    """Below port 1024, the one capability that binds it; above, none and a user namespace."""
    if port < LOW_PORTS:
        return [
            ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE"),
            ("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),
        ]
    return [("CapabilityBoundingSet", ""), ("AmbientCapabilities", ""), ("PrivateUsers", "yes")]


def credential_path(name: str) -> str:
    """A credential as HAProxy opens it: its configuration expands the variable."""
    return "${CREDENTIALS_DIRECTORY}/" + name


def render_unit(
    *,
    haproxy: Path = Path(HAPROXY),
    listen: str,
    metrics_listen: str,
    config_file: Path,
    tls_cert_file: Path | None,
    endpoint_keys_file: Path | None,
) -> str:
    port = min(parse_listen(address)[1] for address in (listen, metrics_listen) if address)
    credentials: list[Line] = []
    if tls_cert_file is not None:
        credentials.append(
            ("LoadCredential", plain_value(f"{TLS_CREDENTIAL}:{tls_cert_file}", "tls"))
        )
    if endpoint_keys_file is not None:
        credentials.append(
            (
                "LoadCredential",
                plain_value(f"{ENDPOINT_KEYS_CREDENTIAL}:{endpoint_keys_file}", "keys"),
            )
        )
    service: list[Line] = [
        ("Type", "notify"),
        ("ExecStartPre", command_line([str(haproxy), "-c", "-q", "-f", str(config_file)], "check")),
        ("ExecStart", command_line([str(haproxy), "-Ws", "-f", str(config_file)], "gateway")),
        ("ExecReload", "/bin/kill -USR2 $MAINPID"),
        ("KillMode", "mixed"),
        ("Restart", "on-failure"),
        ("RestartSec", f"{RESTART_S}s"),
        *credentials,
        ("RuntimeDirectory", RUNTIME_DIRECTORY),
        ("RuntimeDirectoryMode", "0700"),
        ("User", PRODUCT_USER),
        ("Group", PRODUCT_USER),
        ("ProtectHome", "yes"),
        ("RemoveIPC", "yes"),
        *(line for line in COMMON_SANDBOX if line[0] not in OWN_LINES),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("ProcSubset", "pid"),
        ("MemoryDenyWriteExecute", "yes"),
        *port_lines(port),
    ]
    sections: list[tuple[str, list[Line]]] = [
        (
            "Unit",
            [
                ("Description", "epyc-llm gateway: one URL for every approved endpoint (HAProxy)"),
                ("Documentation", "man:haproxy(1)"),
                ("Wants", "network-online.target"),
                ("After", "network-online.target"),
                ("StartLimitIntervalSec", "60"),
                ("StartLimitBurst", "5"),
            ],
        ),
        ("Service", service),
        ("Install", [("WantedBy", "multi-user.target")]),
    ]
    out = ["# epyc-llm gateway: written by epycd; see `epycctl gateway plan`"]
    for name, lines in sections:
        out += ["", f"[{name}]"]
        out += [f"{key}={value}" for key, value in lines]
    return "\n".join(out) + "\n"
