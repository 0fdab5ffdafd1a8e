"""The podman path: a Quadlet `.container` (podman-systemd.unit(5)), Quadlet >= 4.4.

The container drops every capability but SYS_NICE and gains none; the `[Service]` section
is not sandboxed, since its main process is podman (epycd.render.sandbox.QUADLET_LEFT_OUT).
"""

from __future__ import annotations

from epycd.engines.vllm.plan.model import AnyVllmServer
from epycd.engines.vllm.render.commands import (
    container_env,
    container_mounts,
    entrypoint_flags,
    extra_run_flags,
    health_gate,
    health_probe,
    ulimit_flags,
    vllm_serve_in_container,
)
from epycd.engines.vllm.render.gpu import is_gpu, podman_group_args, quadlet_gpu_lines
from epycd.render.commands import numa_list
from epycd.render.healing import (
    crash_recorder_lines,
    health_on_failure_lines,
    restart_lines,
    start_limit_lines,
)
from epycd.render.on_demand import engine_lines, install_sections
from epycd.render.parts import api_key_credential, description, limit_lines, part_of
from epycd.render.syntax import (
    command_line,
    quadlet_argument,
    quadlet_env_assignment,
    quadlet_raw,
)
from epycd.render.text import Line, unit_text

HEALTH_INTERVAL = "10s"
HEALTH_TIMEOUT = "10s"
HEALTH_RETRIES = "3"


def _words(args: list[str], what: str) -> str:
    return " ".join(quadlet_argument(arg, f"{what}[{index}]") for index, arg in enumerate(args))


def container_lines(decisions: AnyVllmServer) -> list[Line]:
    assert decisions.image is not None
    podman_args = [
        "--ipc=host",
        f"--cpuset-cpus={decisions.cpus}",
        f"--cpuset-mems={numa_list(decisions)}",
        *ulimit_flags(decisions),
        *(
            [*podman_group_args(decisions), *entrypoint_flags(decisions)]
            if is_gpu(decisions)
            else extra_run_flags(decisions)
        ),
    ]
    lines: list[Line] = [
        ("ContainerName", decisions.unit_name),
        ("Image", quadlet_raw(decisions.image, "image")),
        ("Pull", "never"),
        ("Exec", _words(vllm_serve_in_container(decisions), "vllm_args")),
        ("Network", "host"),
        ("DropCapability", "all"),
        ("AddCapability", "SYS_NICE SYS_PTRACE" if is_gpu(decisions) else "SYS_NICE"),
        ("NoNewPrivileges", "true"),
        ("PodmanArgs", _words(podman_args, "run_flags")),
    ]
    if is_gpu(decisions):
        lines += quadlet_gpu_lines(decisions)
    lines += [("Volume", quadlet_raw(mount, "mount")) for mount in container_mounts(decisions)]
    lines += [
        ("Environment", quadlet_env_assignment(name, value, f"env.{name}"))
        for name, value in container_env(decisions)
    ]
    if decisions.podman_notify_healthy:
        lines += [
            ("Notify", "healthy"),
            ("HealthCmd", quadlet_raw(health_probe(decisions), "port")),
            ("HealthStartPeriod", f"{decisions.start_timeout_s}s"),
            ("HealthInterval", HEALTH_INTERVAL),
            ("HealthTimeout", HEALTH_TIMEOUT),
            ("HealthRetries", HEALTH_RETRIES),
            *health_on_failure_lines(decisions),
        ]
    return lines


def service_lines(decisions: AnyVllmServer) -> list[Line]:
    lines: list[Line] = [("TimeoutStartSec", str(decisions.start_timeout_s))]
    lines += limit_lines(decisions)
    lines += restart_lines(decisions)
    lines += [
        ("ExecCondition", command_line(argv, f"exec_condition[{index}]"))
        for index, argv in enumerate(decisions.exec_condition)
    ]
    if not decisions.podman_notify_healthy:
        lines.append(("ExecStartPost", command_line(health_gate(decisions), "health")))
        lines += api_key_credential(decisions)
    return lines + crash_recorder_lines(decisions)


def render_container(decisions: AnyVllmServer) -> str:
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
                    *engine_lines(decisions),
                    *start_limit_lines(decisions.healing),
                ],
            ),
            ("Container", container_lines(decisions)),
            ("Service", service_lines(decisions)),
            *install_sections(decisions),
        ],
    )
