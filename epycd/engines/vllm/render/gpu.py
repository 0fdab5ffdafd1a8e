"""Instinct GPU endpoints in units (docs/instinct.md): the recipe's container access to the
GPUs and the renderer's last check of a GPU endpoint's decisions.

The container gets /dev/kfd and /dev/dri, the groups video and render, SYS_PTRACE and no
seccomp filter (the recipe's docker flags, `data/instinct-gpus.json`), `--ipc=host`, and
HIP_VISIBLE_DEVICES naming its GPUs; its CPUs and memory are pinned to the GPUs' NUMA
nodes like a CPU endpoint's. Quadlet writes the same with AddDevice=, GroupAdd=,
AddCapability= and SeccompProfile=.
"""

from __future__ import annotations

from typing import TypeGuard

from epycd.engines.vllm.plan.decide_gpu import GPU_VISIBLE, PLAN_GPU_FLAGS
from epycd.engines.vllm.plan.model import AnyVllmServer, VllmInstinctServer
from epycd.engines.vllm.render.policy import (
    FLAGS_THE_PLAN_PASSES,
    FORBIDDEN_ENV,
    check_runtime,
    check_serve_args,
)
from epycd.host.cpulist import parse_cpulist
from epycd.model.instinct import shipped_gpus
from epycd.render.policy import check_identity, refuse
from epycd.render.text import Line
from epycd.spec.policy import env_refusal

GPU_CAPABILITY = "SYS_PTRACE"
SECCOMP_UNCONFINED = "unconfined"
ENV_THE_GPU_PLAN_SETS = frozenset({GPU_VISIBLE})


def is_gpu(decisions: AnyVllmServer) -> TypeGuard[VllmInstinctServer]:
    return isinstance(decisions, VllmInstinctServer)


def quadlet_gpu_lines(decisions: VllmInstinctServer) -> list[Line]:
    """AddDevice= and SeccompProfile= (Quadlet 4.4); GroupAdd= on podman >= 5 only (the
    fact `podman_notify_healthy` stands for): older Quadlet gets `podman_group_args`."""
    data = shipped_gpus()
    lines: list[Line] = [("AddDevice", device) for device in data.devices]
    if decisions.podman_notify_healthy:
        lines += [("GroupAdd", group) for group in data.groups]
    lines.append(("SeccompProfile", SECCOMP_UNCONFINED))
    return lines


def podman_group_args(decisions: VllmInstinctServer) -> list[str]:
    if decisions.podman_notify_healthy:
        return []
    return [f"--group-add={group}" for group in shipped_gpus().groups]


def check_gpu_decisions(decisions: VllmInstinctServer) -> None:
    """Raise InputError on the first rule a GPU endpoint's decisions break."""
    check_identity(decisions)
    _check_gpus(decisions)
    _check_env(decisions)
    _check_args(decisions)
    if decisions.runtime == "host":
        raise refuse(
            decisions, "runtime", "an Instinct endpoint runs in a container", "plan it again"
        )
    check_runtime(decisions)


def _check_gpus(decisions: VllmInstinctServer) -> None:
    try:
        cpus = parse_cpulist(decisions.cpus)
    except ValueError:
        cpus = []
    if not cpus or not decisions.numa_nodes:
        raise refuse(
            decisions, "cpus", f"{decisions.cpus!r} is not a CPU list", "plan the endpoint again"
        )
    gpus = decisions.gpus
    if not gpus or len(set(gpus)) != len(gpus) or decisions.tensor_parallel_size != len(gpus):
        raise refuse(
            decisions,
            "gpus",
            f"GPUs {gpus} do not match tensor parallel size {decisions.tensor_parallel_size}",
            "plan the endpoint again",
        )
    allowed = shipped_gpus().docker_flags
    for index, flag in enumerate(decisions.run_flags):
        if flag not in allowed:
            raise refuse(
                decisions, f"run_flags[{index}]", f"{flag}: not a flag of the recipe", "remove it"
            )


def _check_env(decisions: VllmInstinctServer) -> None:
    visible = ",".join(map(str, decisions.gpus))
    if decisions.env.get(GPU_VISIBLE) != visible:
        raise refuse(
            decisions,
            f"env.{GPU_VISIBLE}",
            f"{GPU_VISIBLE} must name the plan's GPUs {visible!r}, never be empty",
            "plan the endpoint again",
        )
    for name, value in decisions.env.items():
        if name in FORBIDDEN_ENV:
            raise refuse(decisions, f"env.{name}", f"{name} must not be set", f"remove {name}")
        refusal = None if name in ENV_THE_GPU_PLAN_SETS else env_refusal(name, value)
        if refusal:
            raise refuse(
                decisions, f"env.{name}", f"{name} must not be set: {refusal[0]}", refusal[1]
            )


def _check_args(decisions: VllmInstinctServer) -> None:
    check_serve_args(decisions, FLAGS_THE_PLAN_PASSES | set(PLAN_GPU_FLAGS))
