"""Hand-made plans for the approval tests, shaped like the planner's, from a real detection
of a fake host root (planned_epycctl.py hands them to the real `epycctl`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from epycd.engines.vllm.model.gpu_memory import GpuFit
from epycd.engines.vllm.plan.model import VllmCpuServer, VllmInstinctServer
from epycd.engines.vllm.plan.tuning import omp_bind
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import HostFacts
from epycd.model.facts import MemoryFit
from epycd.plan.endpoint import Endpoint, Plan
from epycd.plan.problem import Problem

PLAN_FILE_ENV = "EPYCD_TEST_PLAN_FILE"


def host_service(name: str, cpus: str, port: int) -> str:
    return (
        "[Unit]\n"
        f"Description=epyc-llm endpoint {name}\n"
        "[Service]\n"
        "Type=notify\n"
        f"ExecCondition=/usr/bin/python3 -m epycd.approval.check {name}\n"
        f"ExecStart=/opt/vllm/bin/vllm serve /srv/models/tiny --port {port}\n"
        f"Environment=VLLM_CPU_OMP_THREADS_BIND={cpus}\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def quadlet_container(name: str, image: str, port: int) -> str:
    return (
        "[Unit]\n"
        f"Description=epyc-llm endpoint {name}\n"
        "[Container]\n"
        f"Image={image}\n"
        "Pull=never\n"
        f"Exec=/srv/models/tiny --port {port}\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def make_plan(
    name: str,
    host: HostFacts,
    config_dir: Path,
    *,
    socket: int = 0,
    port: int = 8000,
    runtime: str = "host",
    fits: bool = True,
    requires_confirmation: bool = False,
    errors: list[str] | None = None,
    extra_units: dict[str, str] | None = None,
) -> Plan:
    sock = host.socket(socket)
    bind = format_cpulist(omp_bind(parse_cpulist(sock.physical_cpus)))
    image = "docker.io/amdih/zendnn_zentorch:test" if runtime != "host" else None
    unit_name = f"epyc-llm-{name}"
    units = (
        {f"{unit_name}.container": quadlet_container(name, image or "", port)}
        if runtime == "podman"
        else {f"{unit_name}.service": host_service(name, sock.physical_cpus, port)}
    )
    units.update(extra_units or {})
    data: dict[str, Any] = {
        "endpoint": name,
        "unit_name": unit_name,
        "config_file": str(config_dir / f"{name}.toml"),
        "model": "/srv/models/tiny",
        "served_model_name": "tiny",
        "model_kind": "text",
        "primary_endpoint": "chat_completions",
        "backend": "zentorch",
        "runtime": runtime,
        "image": image,
        "vllm_executable": "/opt/vllm/bin/vllm" if runtime == "host" else None,
        "vllm_version": "0.25.1",
        "dtype": "bfloat16",
        "socket": socket,
        "socket_reason": f"busy {host.socket_busy_pct.get(socket, 0.0):.1f} %",
        "cpus": sock.physical_cpus,
        "omp_cpus": bind,
        "numa_nodes": sock.numa_nodes,
        "env": {
            "VLLM_CPU_OMP_THREADS_BIND": format_cpulist(
                omp_bind(parse_cpulist(sock.physical_cpus))
            ),
            "VLLM_CPU_KVCACHE_SPACE": "4",
        },
        "kv_cache_gb": 4,
        "memory": MemoryFit(
            weights_gb=1.0,
            kv_bytes_per_token=1024,
            context=512,
            max_num_seqs=4,
            kv_gb=0.1,
            kv_pool_gb=4,
            headroom_gb=16.0,
            required_gb=21.0,
            available_gb=sock.memory_available_gb,
            fits=fits,
            suggested_max_model_len=None,
            action="" if fits else "lower max_model_len",
        ),
        "port": port,
        "max_model_len": 512,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 2048,
        "vllm_args": ["/srv/models/tiny", "--port", str(port)],
        "start_timeout_s": 60,
        "product_python": "/usr/bin/python3",
        "requires_confirmation": requires_confirmation,
        "confirmation_reasons": ["stock vLLM path on a Milan host"]
        if requires_confirmation
        else [],
        "errors": [Problem.legacy(error) for error in errors or []],
        "units": units,
    }
    shaping = json.dumps({k: v for k, v in data.items() if k != "socket_reason"}, default=str)
    units = data.pop("units")
    return Plan(
        decisions=VllmCpuServer.model_validate(data),
        units=units,
        fingerprint=hashlib.sha256(shaping.encode()).hexdigest(),
    )


def write_plan_file(path: Path, plans: dict[str, Plan], host: HostFacts) -> Path:
    path.write_text(
        json.dumps(
            {
                "host": host.model_dump(mode="json"),
                "plans": {n: p.model_dump(mode="json") for n, p in plans.items()},
            }
        )
    )
    return path


def on_gpus(plan: Plan, gpus: list[int]) -> Plan:
    """The CPU plan as an Instinct endpoint's on `gpus`, on a port of its own."""
    decisions = plan.decisions.first
    assert isinstance(decisions, VllmCpuServer)
    cpu_only = {"kind", "omp_cpus", "max_num_batched_tokens", "memory", "invocation"}
    # no CPU invocation on GPUs: its words, as a record from before the invocation holds them
    service = decisions.model_dump(exclude=cpu_only) | {"vllm_args": decisions.vllm_args}
    fit = GpuFit(
        tensor_parallel_size=len(gpus),
        vram_gb=192.0,
        weights_gb=0.6,
        overhead_gb=4.0,
        remaining_for_kv_gb=187.4,
        tier="safe",
    )
    instinct = VllmInstinctServer.model_validate(
        {**service, "gpus": gpus, "port": decisions.port + 100, "gpu_fit": fit}
    )
    return plan.model_copy(update={"decisions": Endpoint.of_server(instinct)})
