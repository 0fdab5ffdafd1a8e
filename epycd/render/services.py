"""The docker and host paths: a `.service` whose main process is epycd's supervisor.

The supervisor starts the server, runs the health gate and sends READY=1 (Type=notify).
Both run sandboxed (epycd.render.sandbox); the approval check (`ExecCondition=`) runs with
full privileges (`+`): it reads the root-only approval records and secret files.
"""

from __future__ import annotations

from epycd.plan.model import AnyServer
from epycd.render import sandbox
from epycd.render.commands import TOKEN_CREDENTIAL, numa_list, supervisor
from epycd.render.healing import crash_recorder_lines, restart_lines, start_limit_lines
from epycd.render.on_demand import engine_lines, engine_service_lines, install_sections
from epycd.render.parts import api_key_credential, description, limit_lines, part_of
from epycd.render.syntax import command_line, env_assignment, plain_value
from epycd.render.text import Line, Section, unit_text


def unit_section(decisions: AnyServer, after: str) -> Section:
    return (
        "Unit",
        [
            ("Description", description(decisions)),
            ("Wants", "network-online.target"),
            ("After", after),
            *part_of(decisions),
            *engine_lines(decisions),
            *start_limit_lines(decisions.healing),
        ],
    )


def service_head(decisions: AnyServer) -> list[Line]:
    lines: list[Line] = [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("TimeoutStartSec", str(decisions.start_timeout_s)),
    ]
    lines += limit_lines(decisions)
    lines += restart_lines(decisions)
    lines += [
        ("ExecCondition", command_line(argv, f"exec_condition[{index}]", prefix="+"))
        for index, argv in enumerate(decisions.exec_condition)
    ]
    return lines


def host_env(decisions: AnyServer) -> list[str]:
    env = dict(sorted(decisions.env.items()))
    hf_home = sandbox.hf_home(decisions)
    if hf_home is not None:
        env["HF_HOME"] = hf_home
    assignments = [env_assignment(name, value, f"env.{name}") for name, value in env.items()]
    if decisions.hf_token_file:
        assignments.append(f"HF_TOKEN_PATH=%d/{TOKEN_CREDENTIAL}")
    return assignments + sandbox.cache_environment(decisions)


def host_unit(decisions: AnyServer, server: list[str]) -> str:
    """`server` (its argv) under the supervisor on the host, pinned to the decisions' cores
    and nodes, sandboxed, its secrets loaded as credentials."""
    service = service_head(decisions)
    service.append(("ExecStart", command_line(supervisor(decisions, server), "command")))
    service += crash_recorder_lines(decisions)
    service += engine_service_lines(decisions)
    service += [
        ("CPUAffinity", decisions.cpus),
        ("NUMAPolicy", "bind"),
        ("NUMAMask", numa_list(decisions)),
    ]
    service += sandbox.host_folders(decisions)
    service += [("Environment", assignment) for assignment in host_env(decisions)]
    if decisions.hf_token_file:
        token = plain_value(decisions.hf_token_file, "hf_token_file")
        service.append(("LoadCredential", f"{TOKEN_CREDENTIAL}:{token}"))
    service += api_key_credential(decisions)
    service += sandbox.host_sandbox(decisions)
    return unit_text(
        decisions.endpoint,
        [
            unit_section(decisions, "network-online.target"),
            ("Service", service),
            *install_sections(decisions),
        ],
    )
