"""The balancer of a multi-instance endpoint (docs/instances.md): the distribution's HAProxy
as its own `.service`, `epyc-llm-NAME.service`, on the endpoint's host and port, in front of
the instances' loopback ports.

Its configuration is in the unit itself (`SetCredential=`, read from `%d`), so the approved
text, the drift check and `epycctl plan` cover it with the rest of the set. HAProxy checks
each instance with `GET /health` (vLLM's and llama-server's health route, open without the
API key) and sends each request to the ready instance with the fewest open connections
(`balance leastconn`); an instance whose check fails gets no requests until it passes again,
and one that refuses a connection is taken out at once (`observe layer4`, one error). A
request whose connection could not be made goes to another instance
(`retry-on conn-failure`, `option redispatch`); one that reached an instance is never sent
twice. Each write goes out at once (`option http-no-delay`): by default HAProxy lets the
kernel hold a small write to fill a segment, which held a streamed first token about 200 ms
(benchmarks/gateway-results.md).

The instances start first (`After=`) and the balancer only `Wants=` them: each instance
restarts by itself (docs/healing.md), and `Requires=` would restart the balancer, and so
drop every open request of the others, whenever one of them restarts. `min_ready` is its
`ExecStartPre=` (`python -m epycd.approval.ready NAME`, privileged: it reads the root-only
approval), which waits for an instance still starting or restarting and fails the start
once fewer than `min_ready` instances are up and none can still come up. Each
instance is `PartOf=` the balancer: stopping or restarting the endpoint stops or restarts
the set. The balancer restarts on failure after `RestartSec=` under the same start limit as
the instances (epycd.render.healing), on its own start budget (`TimeoutStartSec=`,
epycd.plan.healing.balancer_start_s: an instance's, and a margin), without a watchdog and
without the crash recorder (docs/healing.md, "Instance sets"). HAProxy runs in master-worker
mode with systemd's notify support (`-Ws`), as a dynamic user with no capabilities (below port 1024:
CAP_NET_BIND_SERVICE alone), in the endpoint units' sandbox without netlink, and on loopback
it may reach loopback only. `systemd-analyze security` rates it 1.2 (its instances
1.4-1.8); the checks it fails: PrivateNetwork, RestrictAddressFamilies=~AF_INET/AF_UNIX (it
serves HTTP; sd_notify), IPAddressDeny (beyond loopback it answers any client),
SystemCallFilter=~@resources (it raises its open-files limit), RootDirectory (it runs the
distribution's binary), DeviceAllow (the read-only clock ProtectClock= allows).

Decisions without `healing` (approval records made before the healing policy, b30f55f) get the
unit of their time: `Requires=` the instances when `min_ready` is all of them,
`Restart=on-failure` alone.
"""

from __future__ import annotations

from epycd.engines import engine_named
from epycd.errors import InputError
from epycd.listen import is_loopback
from epycd.plan.endpoint import EndpointDecisions
from epycd.plan.healing import balancer_start_s
from epycd.plan.model import EndpointService
from epycd.render.healing import service_restart_lines, start_limit_lines
from epycd.render.sandbox import COMMON_SANDBOX
from epycd.render.syntax import check_printable, command_line, plain_value
from epycd.render.text import Line, unit_text

HAPROXY = "/usr/sbin/haproxy"
"""Debian's and Ubuntu's haproxy package."""
CONFIG_CREDENTIAL = "haproxy.cfg"
READY_MODULE = "epycd.approval.ready"
"""ExecStartPre= of the balancer: at least min_ready instances up (epycd/approval/ready.py)."""
CHECK_INTERVAL = "2s"
TIMEOUT_CONNECT = "5s"
TIMEOUT_STREAM = "1h"
"""Client and server timeouts: a long generation streams for minutes."""
RETRIES = 3
"""Connection attempts after the first: each to another instance (`option redispatch 1`),
and only for a connection that failed (`retry-on conn-failure`), never a request that may
have run."""


def member_service(member: EndpointService) -> str:
    return f"{member.unit_name}.service"


def haproxy_config(decisions: EndpointDecisions) -> str:
    """The whole haproxy.cfg: one frontend on the endpoint's address, one backend of the
    instances on loopback."""
    assert decisions.instance_set is not None
    lines = [
        "global",
        "    log stdout format raw local0",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        f"    timeout connect {TIMEOUT_CONNECT}",
        f"    timeout client {TIMEOUT_STREAM}",
        f"    timeout server {TIMEOUT_STREAM}",
        "    option http-no-delay",
        "frontend endpoint",
        f"    bind {decisions.host}:{decisions.port}",
        "    default_backend instances",
        "backend instances",
        "    balance leastconn",
        f"    retries {RETRIES}",
        "    option redispatch 1",
        "    retry-on conn-failure",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        f"    default-server check inter {CHECK_INTERVAL} fall 2 rise 1"
        " observe layer4 error-limit 1 on-error mark-down",
    ]
    lines += [
        f"    server instance-{member.instance} {member.host}:{member.port}"
        for member in decisions.members
    ]
    return "\n".join(lines) + "\n"


def config_credential(decisions: EndpointDecisions) -> str:
    """`SetCredential=` of the config: systemd C-unescapes it, so newlines are `\\n`; no
    value of it may hold a backslash or a specifier."""
    text = haproxy_config(decisions)
    for bad in ("\\", "%", "\t"):
        if bad in text:
            raise InputError(
                f"the balancer's configuration would hold {bad!r}",
                key="host",
                fix="plan the endpoint again",
            )
    check_printable(text.replace("\n", " "), "balancer")
    return f"{CONFIG_CREDENTIAL}:" + text.replace("\n", "\\n")


def ip_lines(decisions: EndpointDecisions) -> list[Line]:
    """On loopback, the balancer talks to loopback only: its clients and its instances."""
    if not is_loopback(decisions.host):
        return []
    return [("IPAddressAllow", "localhost"), ("IPAddressDeny", "any")]


def _dependencies(decisions: EndpointDecisions) -> list[Line]:
    assert decisions.instance_set is not None
    members = " ".join(member_service(m) for m in decisions.members)
    need = "Wants"
    if (
        decisions.healing is None
        and decisions.instance_set.min_ready >= decisions.instance_set.count
    ):
        need = "Requires"
    return [
        ("Wants", "network-online.target"),
        (need, members),
        ("After", f"network-online.target {members}"),
        *start_limit_lines(decisions.healing),
    ]


def restart_lines(decisions: EndpointDecisions) -> list[Line]:
    """Restart= and RestartSec= from the balancer's healing (no watchdog: HAProxy does not
    ping one); in a record from before the healing policy, Restart=on-failure alone."""
    if decisions.healing is None:
        return [("Restart", "on-failure")]
    return service_restart_lines(decisions.healing)


def engine_name(decisions: EndpointDecisions) -> str:
    """The engine a set's instances run, as its balancer's Description names it, so that
    `systemctl status` says what the balancer fronts (`Engine.title`: `vLLM`, as every vLLM
    set's approved unit has always said)."""
    return engine_named(decisions.engine).title


def render_balancer(decisions: EndpointDecisions) -> str:
    assert decisions.instance_set is not None
    count = decisions.instance_set.count
    engine = engine_name(decisions)
    description = plain_value(
        f"epyc-llm {decisions.endpoint}: HAProxy in front of {count} {engine} instances of "
        f"{decisions.model}",
        "model",
    )
    service = _service_lines(decisions)
    return unit_text(
        decisions.endpoint,
        [
            ("Unit", [("Description", description), *_dependencies(decisions)]),
            ("Service", service),
            ("Install", [("WantedBy", "multi-user.target")]),
        ],
    )


def _service_lines(decisions: EndpointDecisions) -> list[Line]:
    """[Service]: HAProxy under a dynamic user, sandboxed, reading its config from a
    credential; only a port below 1024 keeps the capability to bind it."""
    start = [HAPROXY, "-Ws", "-f", f"%d/{CONFIG_CREDENTIAL}"]
    service: list[Line] = [("Type", "notify")]
    if decisions.healing is not None:
        service.append(("TimeoutStartSec", str(balancer_start_s(decisions.start_timeout_s))))
    service += [
        (
            "ExecCondition",
            command_line(decisions.exec_condition[0], "exec_condition[0]", prefix="+"),
        ),
        (
            "ExecStartPre",
            command_line(
                [decisions.product_python, "-m", READY_MODULE, decisions.endpoint],
                "ready_check",
                prefix="+",
            ),
        ),
        ("SetCredential", config_credential(decisions)),
        ("ExecStart", command_line(start[:3], "balancer") + f" %d/{CONFIG_CREDENTIAL}"),
        ("ExecReload", "/bin/kill -USR2 $MAINPID"),
        ("KillMode", "mixed"),
        *restart_lines(decisions),
        ("DynamicUser", "yes"),
        ("ProtectHome", "yes"),
        ("RemoveIPC", "yes"),
        *(line for line in COMMON_SANDBOX if line[0] != "RestrictAddressFamilies"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        *ip_lines(decisions),
        ("ProcSubset", "pid"),
        ("MemoryDenyWriteExecute", "yes"),
    ]
    if decisions.port >= 1024:
        service.append(("PrivateUsers", "yes"))
    else:
        service += [
            ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE"),
            ("AmbientCapabilities", "CAP_NET_BIND_SERVICE"),
        ]
    return service
