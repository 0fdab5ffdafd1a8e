"""Planning every endpoint file together: spec + host + model + stack -> decisions -> units.

`plan_all` gathers what needs the outside world (endpoint files, model facts, a host vLLM
probe, listening ports, the HF cache folder) through functions it is given, so tests and the
daemon can pass their own; everything after that is pure. Endpoints are planned together so
that they get disjoint sockets (or NUMA node groups) and distinct ports; one endpoint's
error never stops another.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from epycd.host.facts import HostFacts
from epycd.plan.endpoint import UnitRenderer
from epycd.plan.pipeline.place import listened_on, place_all
from epycd.plan.pipeline.prepare import memoized_sources, prepare_all, with_engine_runtimes
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.ports import Listener
from epycd.plan.placement.reservations import NOTHING_HELD, Reservations
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import ModelInspector, VllmProber
from epycd.plan.service.hfcache import resolve_hf_cache
from epycd.settings import Settings, trusted_admin_gid
from epycd.spec import SpecResult, load_endpoints
from epycd.stack import Stack, shipped_stack


@dataclass(frozen=True)
class PlanSources:
    """Where `plan_all` reads the outside world; each None reaches it: the shipped stack, the
    endpoint files of `settings.config_dir`, `inspect_model` and `probe_vllm` (both through
    the probe cache of `settings.run_dir`), the ports listening on this machine,
    `os.environ` for HF_HOME, `settings.host_root`, this Python for the product's tools."""

    stack: Stack | None = None
    specs: list[SpecResult] | None = None
    inspect: ModelInspector | None = None
    probe: VllmProber | None = None
    listeners: Mapping[int, Listener] | None = None
    environ: Mapping[str, str] | None = None
    host_root: Path | None = None
    product_python: str | None = None


def plan_all(
    settings: Settings,
    host: HostFacts,
    *,
    render: UnitRenderer,
    reservations: Reservations = NOTHING_HELD,
    sources: PlanSources | None = None,
) -> list[EndpointResult]:
    """A result per endpoint file of `settings.config_dir` (or `sources.specs`), in name
    order.

    `reservations` (`Reservations.of` the approved plans) keep "auto" endpoints where they
    were approved and keep others off what they hold (sockets, NUMA nodes, ports, instance
    ports, GPUs), running or not, so that adding an endpoint file never moves an approved
    one nor lands on it. `render` turns decisions into units (`epycd.render.render_for_plan`,
    given by the caller). `sources` replace the outside world (`PlanSources`).
    """
    src = sources or PlanSources()
    stack = src.stack or shipped_stack()
    specs = src.specs
    if specs is None:
        specs = load_endpoints(settings.config_dir, precisions=stack.precisions)
    root = src.host_root or settings.host_root
    probes = memoized_sources(settings, src.inspect, src.probe, root)
    host = with_engine_runtimes(host, specs, settings, probes)
    secret_group = trusted_admin_gid(settings.daemon_conf)
    results, ready = prepare_all(specs, host, stack, probes, secret_group)
    planning = {prepared.result.name for prepared in ready}
    configured = {
        spec.name: (spec.path, spec.spec.port)
        for spec in specs
        if spec.spec is not None and isinstance(spec.spec.port, int) and spec.name not in planning
    }
    share = Sharing(
        host=host,
        stack=stack,
        settings=settings,
        hf_cache=resolve_hf_cache(root, src.environ or os.environ),
        listeners=listened_on(src.listeners, reservations, settings, configured),
        product_python=src.product_python or sys.executable,
        render=render,
        reservations=reservations,
    )
    results.update(place_all(ready, share))
    return [results[name] for name in sorted(results)]
