"""Rendering: the exact systemd units for one endpoint, a pure function of its decisions.

`render_units` asks each server's engine (`epycd.render.engines`) to check its decisions once
more, then to write a Quadlet `.container` (podman) or a `.service` (docker, host) whose
every value is quoted by systemd's and Quadlet's rules (epycd.render.syntax); a set's
balancer is the same for every engine.

The HF token never enters a unit, an environment or `podman/docker inspect`: the token file
(root-only, holding only the token) reaches the process as a file and huggingface_hub reads
it through `HF_TOKEN_PATH`. Containers bind-mount it read-only at /run/secrets/hf_token;
the host path loads it with `LoadCredential=` and points `HF_TOKEN_PATH` at `%d/hf_token`.

The API key (api_key_file) never enters a unit, an argv or `inspect` either; vLLM reads it
from VLLM_API_KEY. On the host path the supervisor loads it with `LoadCredential=` and puts
it in vLLM's environment; containers mount it read-only at /run/secrets/api_key and a
one-line Python launcher in the container reads it into VLLM_API_KEY before it becomes
`vllm serve`. The health gate (supervisor, or podman < 5's ExecStartPost) reads the same
credential and sends the key as a Bearer token.
"""

from __future__ import annotations

from pathlib import Path

from epycd.errors import EpycError
from epycd.plan.endpoint import EndpointDecisions, RenderedUnits
from epycd.plan.model import AnyServer, EndpointService
from epycd.render.balancer import render_balancer
from epycd.render.engines import renderer_for
from epycd.render.on_demand import on_demand_files, on_demand_units
from epycd.render.policy import check_identity


def unit_file_name(unit: EndpointService) -> str:
    """A unit's file name: a server's, or a set's balancer (a `.service`)."""
    suffix = ".container" if unit.runtime == "podman" else ".service"
    return unit.unit_name + suffix


def render_units(decisions: EndpointDecisions) -> dict[str, str]:
    """File name -> exact text. Raises InputError (naming the file and key) on unsafe values.
    Each server's unit, an on-demand endpoint's socket and proxy, then, for a set, the
    balancer's."""
    units: dict[str, str] = {}
    for server in decisions.servers:
        units.update(_server_unit(server))
    units.update(on_demand_units(decisions))
    if decisions.instance_set is None:
        return units
    try:
        check_identity(decisions)
        units[f"{decisions.unit_name}.service"] = render_balancer(decisions)
    except EpycError as error:
        if error.file is None:
            error.file = decisions.config_file
        raise
    return units


def _server_unit(server: AnyServer) -> dict[str, str]:
    try:
        renderer = renderer_for(server.engine)
        renderer.check(server)
        text = renderer.unit_text(server)
    except EpycError as error:
        if error.file is None:
            error.file = server.config_file
        raise
    return {unit_file_name(server): text}


def unit_dirs(
    decisions: EndpointDecisions, *, unit_dir: Path, quadlet_dir: Path
) -> dict[str, Path]:
    """File name -> the folder it is installed in (Quadlet's folder for `.container`)."""
    dirs = {
        unit_file_name(server): quadlet_dir if server.runtime == "podman" else unit_dir
        for server in decisions.servers
    }
    if decisions.instance_set is not None:
        dirs = {f"{decisions.unit_name}.service": unit_dir} | dirs
    return dirs | dict.fromkeys(on_demand_files(decisions), unit_dir)


def render_for_plan(
    decisions: EndpointDecisions, unit_dir: Path, quadlet_dir: Path
) -> RenderedUnits:
    """The planner's renderer (`epycd.plan.model.UnitRenderer`): the units and their folders."""
    folders = unit_dirs(decisions, unit_dir=unit_dir, quadlet_dir=quadlet_dir)
    return RenderedUnits(
        render_units(decisions), {name: str(path) for name, path in folders.items()}
    )


__all__ = ["render_for_plan", "render_units", "unit_dirs", "unit_file_name"]
