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
from epycd.plan.endpoint import Plan, UnitRenderer
from epycd.plan.pipeline.build import PlanSources, plan_all
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.reservations import Reservations
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
        render=render,
        reservations=Reservations.of(approved),
        sources=PlanSources(stack=shipped_stack(), specs=specs, host_root=root),
    )
    return Planned(results, host)
