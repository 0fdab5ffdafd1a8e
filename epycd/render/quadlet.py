"""The podman path: a Quadlet `.container` (podman-systemd.unit(5)), Quadlet >= 4.4.

The container drops every capability but SYS_NICE and gains none; the `[Service]` section
is not sandboxed, since its main process is podman (epycd.render.sandbox.QUADLET_LEFT_OUT).
"""

from __future__ import annotations

from epycd.engines import engine_named
from epycd.engines.vllm.plan.model import VllmInstinctEndpoint, VllmServerEndpoint
from epycd.names import unit_name
from epycd.plan.model import ServerEndpoint
from epycd.render import commands, gpu
from epycd.render.healing import (
    crash_recorder_lines,
    health_on_failure_lines,
    restart_lines,
    start_limit_lines,
)
from epycd.render.syntax import (
    command_line,
    plain_value,
    quadlet_argument,
    quadlet_env_assignment,
    quadlet_raw,
)
from epycd.render.text import Line, unit_text

HEALTH_INTERVAL = "10s"
HEALTH_TIMEOUT = "10s"
HEALTH_RETRIES = "3"


def describe(decisions: ServerEndpoint) -> str:
    """The unit's Description, before escaping."""
    where = f"socket {decisions.socket}"
    if isinstance(decisions, VllmInstinctEndpoint):
        where = f"Instinct GPU {','.join(map(str, decisions.gpus))}"
    server = engine_named(decisions.engine).title
    return (
        f"epyc-llm {decisions.endpoint}"
        + (f" instance {decisions.instance}" if decisions.instance is not None else "")
        + f": {server} serving {decisions.model} ({decisions.runtime}, {where})"
    )


def part_of(decisions: ServerEndpoint) -> list[Line]:
    """An instance of a multi-instance endpoint stops and restarts with its balancer."""
    if decisions.instance is None:
        return []
    return [("PartOf", f"{unit_name(decisions.endpoint)}.service")]


def description(decisions: ServerEndpoint) -> str:
    return plain_value(describe(decisions), "model")


def _words(args: list[str], what: str) -> str:
    return " ".join(quadlet_argument(arg, f"{what}[{index}]") for index, arg in enumerate(args))


def container_lines(decisions: VllmServerEndpoint) -> list[Line]:
    assert decisions.image is not None
    podman_args = [
        "--ipc=host",
        f"--cpuset-cpus={decisions.cpus}",
        f"--cpuset-mems={commands.numa_list(decisions)}",
        *commands.ulimit_flags(decisions),
        *(
            [*gpu.podman_group_args(decisions), *commands.entrypoint_flags(decisions)]
            if gpu.is_gpu(decisions)
            else commands.extra_run_flags(decisions)
        ),
    ]
    lines: list[Line] = [
        ("ContainerName", decisions.unit_name),
        ("Image", quadlet_raw(decisions.image, "image")),
        ("Pull", "never"),
        ("Exec", _words(commands.vllm_serve_in_container(decisions), "vllm_args")),
        ("Network", "host"),
        ("DropCapability", "all"),
        ("AddCapability", "SYS_NICE SYS_PTRACE" if gpu.is_gpu(decisions) else "SYS_NICE"),
        ("NoNewPrivileges", "true"),
        ("PodmanArgs", _words(podman_args, "run_flags")),
    ]
    if gpu.is_gpu(decisions):
        lines += gpu.quadlet_gpu_lines(decisions)
    lines += [
        ("Volume", quadlet_raw(mount, "mount")) for mount in commands.container_mounts(decisions)
    ]
    lines += [
        ("Environment", quadlet_env_assignment(name, value, f"env.{name}"))
        for name, value in commands.container_env(decisions)
    ]
    if decisions.podman_notify_healthy:
        lines += [
            ("Notify", "healthy"),
            ("HealthCmd", quadlet_raw(commands.health_probe(decisions), "port")),
            ("HealthStartPeriod", f"{decisions.start_timeout_s}s"),
            ("HealthInterval", HEALTH_INTERVAL),
            ("HealthTimeout", HEALTH_TIMEOUT),
            ("HealthRetries", HEALTH_RETRIES),
            *health_on_failure_lines(decisions),
        ]
    return lines


def service_lines(decisions: VllmServerEndpoint) -> list[Line]:
    lines: list[Line] = [("TimeoutStartSec", str(decisions.start_timeout_s))]
    lines += limit_lines(decisions)
    lines += restart_lines(decisions)
    lines += [
        ("ExecCondition", command_line(argv, f"exec_condition[{index}]"))
        for index, argv in enumerate(decisions.exec_condition)
    ]
    if not decisions.podman_notify_healthy:
        lines.append(("ExecStartPost", command_line(commands.health_gate(decisions), "health")))
        lines += api_key_credential(decisions)
    return lines + crash_recorder_lines(decisions)


def api_key_credential(decisions: ServerEndpoint) -> list[Line]:
    """The API key reaches the health gate as a credential (vLLM reads the mounted file)."""
    if not decisions.api_key_file:
        return []
    path = plain_value(decisions.api_key_file, "api_key_file")
    return [("LoadCredential", f"{commands.API_KEY_CREDENTIAL}:{path}")]


def limit_lines(decisions: ServerEndpoint) -> list[Line]:
    """Open files and locked memory as vLLM wants them (docs/tuning.md rule 5)."""
    return [
        ("LimitNOFILE", str(decisions.limit_nofile)),
        ("LimitMEMLOCK", plain_value(decisions.limit_memlock, "limit_memlock")),
    ]


def render_container(decisions: VllmServerEndpoint) -> str:
    return unit_text(
        decisions.endpoint,
        [
            (
                "Unit",
                [
                    ("Description", description(decisions)),
                    ("Wants", "network-online.target"),
                    ("After", "network-online.target"),
                    *part_of(decisions),
                    *start_limit_lines(decisions.healing),
                ],
            ),
            ("Container", container_lines(decisions)),
            ("Service", service_lines(decisions)),
            ("Install", [("WantedBy", "multi-user.target")]),
        ],
    )
