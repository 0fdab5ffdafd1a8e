"""`epycctl metrics scrape-config`: the Prometheus scrape jobs for this host's epycd and its
gateway.

The block is small and no YAML library is a dependency: every string value is written with
`json.dumps` (a JSON string is a valid YAML string), so nothing is escaped by hand.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket

import click

from epycd.cli.options import NonEmptyText
from epycd.errors import InputError
from epycd.paths import daemon_conf_path
from epycd.settings import parse_listen

DEFAULT_JOB = "epyc-llm"
DEFAULT_INTERVAL = "15s"
TIMEOUT_CAP_MS = 10_000
"""epycd answers within its 0.5 s deadline per scrape; 10 s leaves room for a busy host."""
DURATION = re.compile(r"([0-9]+)(ms|s|m|h)")
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def duration_ms(text: str) -> int:
    """Milliseconds of a Prometheus duration with one unit (`15s`, `1m`, `500ms`)."""
    match = DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 15s, 30s or 1m")
    return int(match[1]) * UNIT_MS[match[2]]


def duration_text(ms: int) -> str:
    for unit in ("h", "m", "s"):
        if ms % UNIT_MS[unit] == 0:
            return f"{ms // UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


class Interval(click.ParamType[int]):
    name = "DURATION"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        try:
            ms = duration_ms(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if ms < 1000:
            self.fail(f"{value!r} is shorter than 1s", param, ctx)
        return ms


def scrape_timeout_ms(interval_ms: int) -> int:
    """Below the interval (Prometheus refuses a timeout above it): 10 s, or two thirds of a
    shorter interval."""
    return min(TIMEOUT_CAP_MS, interval_ms * 2 // 3)


def listen_of(listen: str) -> tuple[str, int]:
    if not listen:
        raise InputError(
            'metrics_listen is "": epycd serves no /metrics, so there is nothing to scrape',
            file=daemon_conf_path(),
            key="metrics_listen",
            fix='set metrics_listen = "127.0.0.1:9464" (or ADDRESS:PORT) in epycd.conf, then '
            "`systemctl reload epycd`",
        )
    return parse_listen(listen)


def target_of(address: str, port: int, host: str) -> str:
    """What Prometheus connects to: the address epycd listens on, or this host's name when
    it listens on every address (0.0.0.0 or ::)."""
    ip = ipaddress.ip_address(address)
    if ip.is_unspecified:
        return f"{host}:{port}"
    return f"[{address}]:{port}" if ip.version == 6 else f"{address}:{port}"


def dropin_lines(port: int) -> list[str]:
    """The drop-in of epycd.service that lets it serve metrics elsewhere (units/epycd.service)."""
    return [
        "#   `systemctl edit epycd`, then `systemctl restart epycd`:",
        "#     [Service]",
        f"#     SocketBindAllow=tcp:{port}",
        "#     IPAddressAllow=PROMETHEUS-ADDRESS",
    ]


def job_lines(job: str, interval_ms: int, target: str, host: str) -> list[str]:
    dumps = json.dumps
    return [
        f"  - job_name: {dumps(job)}",
        f"    scrape_interval: {dumps(duration_text(interval_ms))}",
        f"    scrape_timeout: {dumps(duration_text(scrape_timeout_ms(interval_ms)))}",
        f"    metrics_path: {dumps('/metrics')}",
        "    static_configs:",
        f"      - targets: [{dumps(target)}]",
        "        labels:",
        f"          host: {dumps(host)}",
    ]


def gateway_job(listen: str, job: str, interval_ms: int, host: str) -> list[str]:
    """The job of the gateway's HAProxy exporter (docs/gateway.md, "Metrics")."""
    address, port = parse_listen(listen)
    return [
        f"# The gateway's HAProxy exporter on {listen} (gateway_metrics_listen): requests,",
        '# answers by class and times per endpoint (proxy="endpoint-NAME"). Its use by',
        "# client and model is in epycd's own /metrics (epyc_llm_gateway_*).",
        *job_lines(f"{job}-gateway", interval_ms, target_of(address, port, host), host),
    ]


def scrape_config(
    listen: str, job: str, interval_ms: int, host: str, gateway_metrics: str = ""
) -> str:
    """epycd's job, and the gateway's where `gateway_metrics` is its metrics address."""
    address, port = listen_of(listen)
    target = target_of(address, port, host)
    conf = daemon_conf_path()
    lines = [
        f"# epycd on {host} serves /metrics on {listen} (metrics_listen in {conf}).",
        "# Put this under scrape_configs: in prometheus.yml (docs/metrics.md).",
    ]
    if ipaddress.ip_address(address).is_loopback:
        lines += [
            f"# {address} is loopback: this works only for a Prometheus on {host} itself.",
            "# For a Prometheus elsewhere, listen on an address it reaches:",
            f'#   metrics_listen = "ADDRESS:{port}" in {conf}',
            "#   and allow it to epycd:",
            *dropin_lines(port),
        ]
    else:
        lines += [
            "# epycd.service lets epycd bind only loopback port 9464: this address needs",
            *dropin_lines(port),
        ]
    lines += job_lines(job, interval_ms, target, host)
    if gateway_metrics:
        lines += gateway_job(gateway_metrics, job, interval_ms, host)
    return "\n".join(lines)


@click.group()
def metrics() -> None:
    """Prometheus metrics of epycd and its endpoints (docs/metrics.md)."""


@metrics.command("scrape-config")
@click.option(
    "--job", type=NonEmptyText(), default=DEFAULT_JOB, show_default=True, help="the job_name"
)
@click.option(
    "--interval",
    type=Interval(),
    default=DEFAULT_INTERVAL,
    show_default=True,
    help="scrape_interval (the timeout is 10s, or 2/3 of a shorter interval)",
)
def scrape_config_command(job: str, interval: int) -> None:
    """The scrape_configs entries for this host's epycd (metrics_listen in epycd.conf) and
    its gateway (gateway_metrics_listen, where gateway_listen is set)."""
    from epycd.settings import load_settings

    settings = load_settings()
    gateway = settings.gateway_metrics_listen if settings.gateway_listen else ""
    host = socket.gethostname()
    click.echo(scrape_config(settings.metrics_listen, job, interval, host, gateway))
