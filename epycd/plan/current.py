"""The one planning sequence every command runs: the shipped stack, every endpoint file, the
host's facts (with its per-socket load when that can change a choice), then `plan_all` with
the probe cache and the approved plans holding their sockets and ports.

`epycctl plan`, `approve`, `quickstart`, `status`, `start` and the daemon all plan through
`plan_endpoints`, so that each of them sees the plan the others see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from epycd.host.facts import HostFacts
from epycd.names import INSTANCE_SEPARATOR
from epycd.plan.build import plan_all
from epycd.plan.model import Plan, UnitRenderer
from epycd.plan.result import EndpointResult
from epycd.settings import Settings
from epycd.spec import SpecResult, load_endpoints
from epycd.stack import shipped_stack

LOAD_SAMPLE_SECONDS = 0.5
"""The interval of the two /proc/stat samples that measure each socket's load."""


class Planned(NamedTuple):
    """Every endpoint file's result, in name order, and the host facts they were planned on."""

    results: list[EndpointResult]
    host: HostFacts

    def result(self, name: str) -> EndpointResult | None:
        return next((r for r in self.results if r.endpoint == name), None)


def endpoint_specs(settings: Settings) -> list[SpecResult]:
    """Every endpoint file of the config folder, validated against the shipped stack."""
    return load_endpoints(settings.config_dir, precisions=shipped_stack().precisions)


def gather_host(root: Path, valid_endpoints: int, sample_seconds: float) -> HostFacts:
    """Host facts; per-socket load is sampled only when it can change the choice (fewer
    endpoints than sockets), since every socket is used otherwise."""
    from epycd.host.detect import detect_host, socket_cpus
    from epycd.host.load import sample_socket_busy

    host = detect_host(root)
    if host.sockets > 1 and valid_endpoints < host.sockets and sample_seconds > 0:
        busy = sample_socket_busy(root, socket_cpus(host.socket_topology), sample_seconds)
        host = host.model_copy(update={"socket_busy_pct": busy})
    return host


def approved_sockets(approved: Mapping[str, Plan]) -> dict[str, int]:
    """Endpoint -> the socket of its approved plan (Instinct plans hold GPUs instead: their
    `approved_gpus`). A multi-instance set holds every NUMA
    node its instances use, on its own socket and (`placement = "host"`) on the others: each
    node but the first under `NAME_NODE` (never an endpoint's name), so that no other
    endpoint is given a part of them (docs/instances.md)."""
    held = {name: plan.socket for name, plan in approved.items() if not plan.gpus}
    for name, plan in approved.items():
        members = plan.instances.members if plan.instances is not None else []
        nodes = sorted({(m.socket, node) for m in members for node in m.numa_nodes})
        for socket, node in nodes[1:]:
            held[f"{name}{INSTANCE_SEPARATOR}{node}"] = socket
    return held


def plan_endpoints(
    settings: Settings,
    approved: Mapping[str, Plan],
    *,
    render: UnitRenderer,
    specs: Sequence[SpecResult] | None = None,
    host: HostFacts | None = None,
    host_root: Path | None = None,
    sample_seconds: float = LOAD_SAMPLE_SECONDS,
) -> Planned:
    """Every endpoint file (or `specs`) planned together on this host (or `host`).

    `approved` is endpoint -> its approved plan: an approved endpoint keeps its socket and
    port, and no other plan is given them. `host_root` reads another root than the
    settings' one (`epycctl plan --root`). `render` is the renderer the plan layer may not
    import: `epycd.render.render_for_plan`.
    """
    root = host_root or settings.host_root
    specs = list(endpoint_specs(settings) if specs is None else specs)
    if host is None:
        host = gather_host(root, sum(spec.ok for spec in specs), sample_seconds)
    results = plan_all(
        settings,
        host,
        stack=shipped_stack(),
        specs=specs,
        host_root=root,
        render=render,
        approved_sockets=approved_sockets(approved),
        approved_gpus={name: plan.gpus for name, plan in approved.items() if plan.gpus},
        approved_ports={name: plan.port for name, plan in approved.items()},
        approved_instance_ports={
            name: [m.port for m in plan.instances.members]
            for name, plan in approved.items()
            if plan.instances is not None
        },
    )
    return Planned(results, host)
