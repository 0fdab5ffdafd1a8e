"""Each endpoint file made ready for placement (`prepare`, `prepare_all`) by its engine's
planner (`epycd.plan.engines`): its secrets checked, its route chosen, its model inspected
and refused when the engine cannot serve it. The model inspector and the vLLM prober each
run once per model or executable in one planning run (`memoized_sources`); an engine's own
runtime is probed only when an endpoint file asks for it (`with_engine_runtimes`)."""

from __future__ import annotations

import functools
from pathlib import Path

from epycd.errors import EpycError
from epycd.host.facts import HostFacts, HostVllmFacts
from epycd.host.probe_cache import ProbeCache
from epycd.host.pyheaders import with_python_headers
from epycd.model.facts import ModelFacts
from epycd.plan.engines import planner_for, planners
from epycd.plan.pipeline.choose import prepare_auto
from epycd.plan.pipeline.result import EndpointResult, against_endpoint_file, crashed, failed
from epycd.plan.prepared import (
    MissingPrerequisite,
    ModelInspector,
    Prepared,
    Sources,
    VllmProber,
)
from epycd.plan.service.secrets import UnreadableHere, unreadable_here
from epycd.settings import Settings
from epycd.spec import SpecResult
from epycd.spec.key_setting import AUTO_ENGINE
from epycd.stack import Stack


def default_inspector(model: str, **kwargs: object) -> ModelFacts:
    from epycd.model.check import inspect_model

    return inspect_model(model, **kwargs)  # type: ignore[arg-type]


def prepare(
    result: SpecResult,
    host: HostFacts,
    stack: Stack,
    sources: Sources,
    secret_group: int | None = None,
) -> Prepared:
    """`secret_group`: the admin group root's epycd.conf names (`trusted_admin_gid`), which
    may be the group of a key or token file (`read_root_only`)."""
    assert result.spec is not None
    if result.spec.engine == AUTO_ENGINE:
        return prepare_auto(result, host, stack, sources, secret_group)
    return planner_for(result.spec.engine).prepare(result, host, stack, sources, secret_group)


def memoized_sources(
    settings: Settings, inspect: ModelInspector | None, probe: VllmProber | None, root: Path
) -> Sources:
    """The model inspector and vLLM prober (by default through the probe cache of
    `settings.run_dir`), each asked once per model or executable in one planning run; a
    probed vLLM comes with its interpreter's Python headers on the host at `root`."""
    probes = ProbeCache.in_run_dir(settings.run_dir)
    inspect_model = inspect or functools.partial(default_inspector, probe_cache=probes)
    probe_vllm = probe or probes.probe
    probed: dict[str, HostVllmFacts] = {}
    inspected: dict[tuple[object, ...], ModelFacts] = {}

    def cached_probe(executable: str) -> HostVllmFacts:
        if executable not in probed:
            probed[executable] = with_python_headers(probe_vllm(executable), root)
        return probed[executable]

    def cached_inspect(model: str, **kwargs: object) -> ModelFacts:
        key = (model, *sorted(kwargs.items()))
        if key not in inspected:
            inspected[key] = inspect_model(model, **kwargs)
        return inspected[key]

    return Sources(inspect=cached_inspect, probe_vllm=cached_probe, settings=settings)


def prepare_all(
    specs: list[SpecResult],
    host: HostFacts,
    stack: Stack,
    sources: Sources,
    secret_group: int | None = None,
) -> tuple[dict[str, EndpointResult], list[Prepared]]:
    """Each endpoint file routed and its model inspected: the failed ones as results, the
    others ready to be placed. Each on its own: one that raises what no rule foresaw is its
    own failure (`crashed`), never the others'."""
    results: dict[str, EndpointResult] = {}
    ready: list[Prepared] = []
    for spec_result in specs:
        if not spec_result.ok:
            results[spec_result.name] = failed(
                spec_result, *spec_result.errors, unreadable_here=unreadable_here(spec_result.path)
            )
            continue
        try:
            ready.append(prepare(spec_result, host, stack, sources, secret_group))
        except EpycError as exc:
            against_endpoint_file(exc, spec_result.path)
            here = exc.path if isinstance(exc, UnreadableHere) else None
            first = exc.prerequisite if isinstance(exc, MissingPrerequisite) else None
            results[spec_result.name] = failed(
                spec_result, exc, unreadable_here=here, prerequisite=first
            )
        except Exception as exc:  # the planning boundary: any other error is this file's
            results[spec_result.name] = crashed(spec_result, exc, "preparing the endpoint")
    return results, ready


def with_engine_runtimes(
    host: HostFacts, specs: list[SpecResult], settings: Settings, sources: Sources
) -> HostFacts:
    """The host with each engine's own runtime where an endpoint file asks for it
    (`EnginePlanner.with_runtime`)."""
    for planner in planners():
        host = planner.with_runtime(host, specs, settings, sources)
    return host
