"""The docker path: a `.service` whose main process is epycd's supervisor running `docker
run` of vLLM's image (the host path is `epycd.render.services`' `host_unit`)."""

from __future__ import annotations

from epycd.engines.vllm.plan.model import AnyVllmServer
from epycd.engines.vllm.render.commands import DOCKER, docker_run
from epycd.render import sandbox
from epycd.render.commands import supervisor
from epycd.render.healing import crash_recorder_lines
from epycd.render.on_demand import engine_service_lines, install_sections
from epycd.render.parts import api_key_credential
from epycd.render.services import service_head, unit_section
from epycd.render.syntax import command_line
from epycd.render.text import unit_text


def render_docker(decisions: AnyVllmServer) -> str:
    service = service_head(decisions)
    service += [
        ("ExecStartPre", "-" + _docker_rm(decisions)),
        (
            "ExecStart",
            command_line(supervisor(decisions, docker_run(decisions)), "command"),
        ),
        *crash_recorder_lines(decisions),
        *engine_service_lines(decisions),
    ]
    service += api_key_credential(decisions)
    service += sandbox.docker_sandbox(decisions)
    return unit_text(
        decisions.endpoint,
        [
            unit_section(decisions, "network-online.target docker.service"),
            ("Service", service),
            *install_sections(decisions),
        ],
    )


def _docker_rm(decisions: AnyVllmServer) -> str:
    """`docker` by name: systemd finds it in its fixed search path (the `-` forgives absence)."""
    return f"{DOCKER} rm -f {decisions.unit_name}"
