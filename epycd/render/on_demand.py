"""The units of an on-demand endpoint (docs/on-demand.md), the pattern of
systemd-socket-proxyd(8): `epyc-llm-NAME.socket` holds the endpoint's address from boot; the
first connection starts `epyc-llm-NAME_proxy.service`, which requires the engine's unit
(Type=notify, started once its health gate passed) and passes each connection to the
engine's loopback port; after the idle time with no connection the proxy exits, and the
engine, no longer needed (`StopWhenUnneeded=`), is stopped. The engines of one swap group
conflict: starting one stops the others (`Conflicts=`), the stop ordered first."""

from __future__ import annotations

from epycd.names import INSTANCE_SEPARATOR, unit_name
from epycd.plan.endpoint import EndpointDecisions
from epycd.plan.model import EndpointService, OnDemand
from epycd.render.sandbox import COMMON_SANDBOX
from epycd.render.syntax import plain_value
from epycd.render.text import Line, Section, unit_text

SOCKET_PROXYD = "/lib/systemd/systemd-socket-proxyd"
"""systemd's own proxy (systemd 246 and later have --exit-idle-time)."""
PROXY_SUFFIX = "proxy"


def proxy_unit(endpoint: str) -> str:
    """The proxy's unit stem: NAME_proxy is never an endpoint's name (`_` is the separator
    of a set's instances, which endpoint names cannot hold)."""
    return f"{unit_name(endpoint)}{INSTANCE_SEPARATOR}{PROXY_SUFFIX}"


def socket_file(endpoint: str) -> str:
    return f"{unit_name(endpoint)}.socket"


def proxy_file(endpoint: str) -> str:
    return f"{proxy_unit(endpoint)}.service"


def engine_lines(decisions: EndpointService) -> list[Line]:
    """[Unit] lines of an on-demand engine: stopped once no proxy needs it, and exclusive
    with the other engines of its swap group. Ordering makes the stop of the other run
    before this start; one direction per pair (to the names after it) avoids a cycle."""
    on_demand = decisions.on_demand
    if on_demand is None:
        return []
    others = [name for name in on_demand.swap_group if name != decisions.endpoint]
    lines: list[Line] = [("StopWhenUnneeded", "yes")]
    if others:
        lines.append(("Conflicts", " ".join(f"{unit_name(n)}.service" for n in others)))
        after = [f"{unit_name(n)}.service" for n in others if n > decisions.endpoint]
        if after:
            lines.append(("After", " ".join(after)))
    return lines


def engine_service_lines(decisions: EndpointService) -> list[Line]:
    """[Service] lines of an on-demand engine under the supervisor: systemd's stop goes to
    the supervisor alone, which stops the server once (`KillMode=mixed`; what is left after
    it exits is killed). With every process of the unit signalled, llama-server took the
    supervisor's forwarded signal as a second interrupt and exited 1, a failed run for each
    stop an idle time or a swap asked for."""
    if decisions.on_demand is None:
        return []
    return [("KillMode", "mixed")]


def install_sections(decisions: EndpointService) -> list[Section]:
    """[Install] of a unit that starts at boot; an on-demand engine has none: its socket
    starts at boot, and a request starts the engine."""
    if decisions.on_demand is not None:
        return []
    return [("Install", [("WantedBy", "multi-user.target")])]


def listen_stream(host: str, port: int) -> str:
    """`ListenStream=` of an address: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def render_socket(decisions: EndpointDecisions) -> str:
    address = listen_stream(plain_value(decisions.host, "host"), decisions.port)
    return unit_text(
        decisions.endpoint,
        [
            (
                "Unit",
                [
                    (
                        "Description",
                        plain_value(f"epyc-llm {decisions.endpoint}: on-demand port", "model"),
                    )
                ],
            ),
            (
                "Socket",
                [
                    ("ListenStream", address),
                    ("Service", proxy_file(decisions.endpoint)),
                ],
            ),
            ("Install", [("WantedBy", "sockets.target")]),
        ],
    )


def render_proxy(decisions: EndpointDecisions, on_demand: OnDemand) -> str:
    engine = f"{decisions.unit_name}.service"
    target = f"127.0.0.1:{on_demand.engine_port}"
    start = f"{SOCKET_PROXYD} --exit-idle-time={on_demand.idle_stop_s}s {target}"
    return unit_text(
        decisions.endpoint,
        [
            (
                "Unit",
                [
                    (
                        "Description",
                        plain_value(
                            f"epyc-llm {decisions.endpoint}: on-demand proxy to {target}", "model"
                        ),
                    ),
                    ("Requires", engine),
                    ("After", engine),
                ],
            ),
            (
                "Service",
                [
                    ("ExecStart", start),
                    ("Sockets", socket_file(decisions.endpoint)),
                    ("DynamicUser", "yes"),
                    ("PrivateUsers", "yes"),
                    ("ProtectHome", "yes"),
                    ("RemoveIPC", "yes"),
                    ("MemoryDenyWriteExecute", "yes"),
                    ("ProcSubset", "pid"),
                    *(line for line in COMMON_SANDBOX if line[0] != "RestrictAddressFamilies"),
                    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
                ],
            ),
        ],
    )


def on_demand_files(decisions: EndpointDecisions) -> list[str]:
    """The file names of the socket and the proxy; none for an endpoint that stays up."""
    if decisions.on_demand is None:
        return []
    return [socket_file(decisions.endpoint), proxy_file(decisions.endpoint)]


def on_demand_units(decisions: EndpointDecisions) -> dict[str, str]:
    """File name -> text of the socket and the proxy; none for an endpoint that stays up."""
    on_demand = decisions.on_demand
    if on_demand is None:
        return {}
    return {
        socket_file(decisions.endpoint): render_socket(decisions),
        proxy_file(decisions.endpoint): render_proxy(decisions, on_demand),
    }
