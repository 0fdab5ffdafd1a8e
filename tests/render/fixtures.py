"""Hand-written decisions, one per unit path, as the planner would hand them over: the
renderer's own tests (policy, quoting, real tools). The golden units come from the real
planner instead (tests/golden/, tests/render/test_golden.py).

The canonical paths (/opt/epyc-llm/...) keep the rendered text the same on every machine;
`runnable()` points the executables at real files so that systemd-analyze accepts them.
"""

from __future__ import annotations

from pathlib import Path

from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.model.facts import MemoryFit
from epycd.plan.endpoint import Endpoint, EndpointDecisions, Plan, decisions_of
from epycd.plan.healing import Restart, healing_for
from epycd.plan.model import AnyServer, HfCacheMount
from epycd.plan.service.unit_commands import approval_check_argv
from epycd.render import render_units

PRODUCT_PYTHON = "/opt/epyc-llm/venv/bin/python"
GENOA_IMAGE = (
    "docker.io/amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"
)
STOCK_IMAGE = "docker.io/vllm/vllm-openai-cpu:v0.29.0-x86_64"
# socket 1 of a dual Genoa 9654 (96 cores per socket), NPS4: nodes 4-7
SOCKET1_CPUS = "96-191"
SOCKET1_OMP = "96-189"
"""Cores 96 and 97 are the front end's (docs/tuning.md rule 1: 2 on 64 cores and more)."""


def _memory(kv_pool_gb: int) -> MemoryFit:
    return MemoryFit(
        weights_gb=1.4,
        kv_bytes_per_token=114688,
        context=8192,
        max_num_seqs=8,
        kv_gb=7.0,
        kv_pool_gb=kv_pool_gb,
        headroom_gb=16.0,
        required_gb=1.4 + kv_pool_gb + 16.0,
        available_gb=350.0,
        fits=True,
        suggested_max_model_len=None,
        action="fits",
    )


def _approval_check(name: str) -> list[str]:
    return approval_check_argv(PRODUCT_PYTHON, name)


def _base(name: str, **changes: object) -> VllmCpuServer:
    fields: dict[str, object] = {
        "endpoint": name,
        "unit_name": f"epyc-llm-{name}",
        "config_file": f"/etc/epyc-llm/{name}.toml",
        "model": "Qwen/Qwen3-0.6B",
        "served_model_name": "Qwen/Qwen3-0.6B",
        "model_kind": "text",
        "primary_endpoint": "chat_completions",
        "backend": "zentorch",
        "runtime": "podman",
        "image": GENOA_IMAGE,
        "vllm_version": "0.25.1",
        "dtype": "bfloat16",
        "socket": 1,
        "socket_reason": "socket 0 is busy (62 %), socket 1 is idle (3 %)",
        "cpus": SOCKET1_CPUS,
        "omp_cpus": SOCKET1_OMP,
        "numa_nodes": [4, 5, 6, 7],
        "env": {
            "VLLM_CPU_OMP_THREADS_BIND": SOCKET1_OMP,
            "VLLM_CPU_KVCACHE_SPACE": "140",
        },
        "kv_cache_gb": 140,
        "memory": _memory(140),
        "port": 8000,
        "max_model_len": 8192,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "vllm_args": [
            "Qwen/Qwen3-0.6B",
            "--dtype",
            "bfloat16",
            "--host",
            "127.0.0.1",
            "--port",
            "8000",
            "--max-model-len",
            "8192",
            "--max-num-seqs",
            "8",
            "--served-model-name",
            "Qwen/Qwen3-0.6B",
        ],
        "run_flags": ["--ipc=host", "--network=host", "--cap-add=SYS_NICE"],
        "hf_cache": HfCacheMount(host_path="/srv/hf-cache"),
        "start_timeout_s": 1200,
        "podman_notify_healthy": True,
        "product_python": PRODUCT_PYTHON,
        "exec_condition": [_approval_check(name)],
        "status_file": f"/run/epyc-llm/endpoints/{name}/status.json",
        "restart": "on-failure",
    }
    fields.update(changes)
    decisions = VllmCpuServer.model_validate(fields)
    return with_restart(decisions, decisions.restart) if "healing" not in changes else decisions


def with_restart(decisions: VllmCpuServer, restart: Restart) -> VllmCpuServer:
    """`restart` and the healing the planner gives it (epycd.plan.service.served.service_fields)."""
    supervised = decisions.runtime != "podman"
    healing = healing_for(restart, decisions.start_timeout_s, supervised=supervised)
    return decisions.model_copy(update={"restart": restart, "healing": healing})


def genoa_podman() -> VllmCpuServer:
    """Socket 1 of a dual Genoa NPS4 on podman 5 (Notify=healthy), throughput flags on."""
    decisions = _base("qwen")
    env = {
        **decisions.env,
        "TORCHINDUCTOR_FREEZING": "1",
        "VLLM_USE_AOT_COMPILE": "0",
        "ZENTORCH_WEIGHT_PREPACK": "1",
    }
    return decisions.model_copy(update={"env": env})


def podman_before_5() -> VllmCpuServer:
    """podman 4.4-4.x: no Notify=healthy, the health gate runs as ExecStartPost."""
    return _base("qwen-old", podman_notify_healthy=False, port=8001).model_copy(
        update={"recorded_vllm_args": _args_with_port(8001)}
    )


def milan_docker() -> VllmCpuServer:
    """Stock image on docker (its entrypoint is `vllm serve`), socket 0 of one Milan."""
    return _base(
        "olmo",
        runtime="docker",
        backend="stock",
        image=STOCK_IMAGE,
        image_entrypoint_is_vllm_serve=True,
        model="allenai/OLMo-2-0425-1B",
        served_model_name="olmo-1b",
        primary_endpoint="completions",
        socket=0,
        socket_reason="single socket",
        cpus="0-63",
        omp_cpus="0-61",
        numa_nodes=[0],
        env={"VLLM_CPU_OMP_THREADS_BIND": "0-61", "VLLM_CPU_KVCACHE_SPACE": "40"},
        kv_cache_gb=40,
        memory=_memory(40),
        port=8002,
        vllm_args=[
            "allenai/OLMo-2-0425-1B",
            "--dtype",
            "bfloat16",
            "--host",
            "127.0.0.1",
            "--port",
            "8002",
            "--served-model-name",
            "olmo-1b",
        ],
        podman_notify_healthy=False,
    )


def host_vllm(vllm: str = "/opt/vllm-env/bin/vllm") -> VllmCpuServer:
    """A host vLLM from a venv, pinned with CPUAffinity=/NUMAMask=."""
    return _base(
        "host-qwen",
        runtime="host",
        image=None,
        vllm_executable=vllm,
        cpus="0-47",
        omp_cpus="0-46",
        socket=0,
        socket_reason="socket 0 is idle",
        numa_nodes=[0, 1],
        env={"VLLM_CPU_OMP_THREADS_BIND": "0-46"},
        port=8003,
        vllm_version="0.32.0",
        vllm_args=[*_args_with_port(8003), "--kv-cache-memory-bytes", str(64 * 1024**3)],
        podman_notify_healthy=False,
        hf_cache=HfCacheMount(host_path="/var/cache/hf home"),
    )


def gated_with_token() -> VllmCpuServer:
    """A gated model: the token file reaches the process, never the unit."""
    return _base(
        "llama",
        model="meta-llama/Llama-3.2-1B-Instruct",
        served_model_name="llama-1b",
        hf_token_file="/etc/epyc-llm/secrets/llama.token",
        port=8004,
        vllm_args=[
            "meta-llama/Llama-3.2-1B-Instruct",
            "--host",
            "127.0.0.1",
            "--port",
            "8004",
            "--served-model-name",
            "llama-1b",
        ],
    )


def host_with_token(vllm: str = "/opt/vllm-env/bin/vllm") -> VllmCpuServer:
    """The host path with `restart = "no"`: Restart=no, the watchdog kept."""
    name = "host-llama"
    return with_restart(host_vllm(vllm), "no").model_copy(
        update={
            "endpoint": name,
            "unit_name": f"epyc-llm-{name}",
            "config_file": f"/etc/epyc-llm/{name}.toml",
            "hf_token_file": f"/etc/epyc-llm/secrets/{name}.token",
            "exec_condition": [_approval_check(name)],
            "status_file": f"/run/epyc-llm/endpoints/{name}/status.json",
        }
    )


def _args_with_port(port: int, host: str = "127.0.0.1") -> list[str]:
    return ["Qwen/Qwen3-0.6B", "--dtype", "bfloat16", "--host", host, "--port", str(port)]


def _renamed(decisions: VllmCpuServer, name: str, **changes: object) -> VllmCpuServer:
    assert set(changes) <= set(VllmCpuServer.model_fields), changes  # model_copy checks none
    return decisions.model_copy(
        update={
            "endpoint": name,
            "unit_name": f"epyc-llm-{name}",
            "config_file": f"/etc/epyc-llm/{name}.toml",
            "exec_condition": [_approval_check(name)],
            "status_file": f"/run/epyc-llm/endpoints/{name}/status.json",
            **changes,
        }
    )


def podman_before_5_with_key() -> VllmCpuServer:
    """An API key on podman < 5: the container reads the mounted key file into VLLM_API_KEY;
    the ExecStartPost gate reads the credential."""
    return _renamed(podman_before_5(), "qwen-key", api_key_file="/etc/epyc-llm/secrets/qwen.key")


def docker_exposed_with_key() -> VllmCpuServer:
    """Every interface, with an API key, on the stock image whose entrypoint is replaced."""
    decisions = milan_docker()
    args = [arg if arg != "127.0.0.1" else "0.0.0.0" for arg in decisions.vllm_args]
    return _renamed(
        decisions,
        "olmo-key",
        host="0.0.0.0",
        recorded_vllm_args=args,
        api_key_file="/etc/epyc-llm/secrets/olmo.key",
    )


def host_ipv6_with_key(vllm: str = "/opt/vllm-env/bin/vllm") -> VllmCpuServer:
    """Every IPv6 interface, with an API key the supervisor hands to vLLM."""
    return _renamed(
        host_vllm(vllm),
        "host-key",
        host="::",
        recorded_vllm_args=[
            *_args_with_port(8003, "::"),
            "--kv-cache-memory-bytes",
            str(64 * 1024**3),
        ],
        api_key_file="/etc/epyc-llm/secrets/host.key",
    )


CASES = {
    "genoa-podman": genoa_podman,
    "podman-before-5": podman_before_5,
    "milan-docker": milan_docker,
    "host-vllm": host_vllm,
    "gated-podman-token": gated_with_token,
    "host-vllm-token": host_with_token,
    "podman-before-5-key": podman_before_5_with_key,
    "docker-exposed-key": docker_exposed_with_key,
    "host-ipv6-key": host_ipv6_with_key,
}


def runnable(decisions: VllmCpuServer, python: str, vllm: Path) -> VllmCpuServer:
    """The same decisions with executables that exist on this machine."""
    pre = [[python, *argv[1:]] for argv in decisions.exec_condition]
    update: dict[str, object] = {"product_python": python, "exec_condition": pre}
    if decisions.vllm_executable:
        update["vllm_executable"] = str(vllm)
    return decisions.model_copy(update=update)


def as_plan(decisions: EndpointDecisions | AnyServer, **changes: object) -> Plan:
    """The decisions as a plan (no units rendered) with `changes` applied, for the code that
    reads an approved plan."""
    plan_keys = set(Plan.model_fields) - {"decisions"}
    fields: dict[str, object] = {"units": {}, "fingerprint": "0" * 64}
    fields |= {key: value for key, value in changes.items() if key in plan_keys}
    update = {key: value for key, value in changes.items() if key not in plan_keys}
    return Plan.model_validate({**fields, "decisions": decisions.model_copy(update=update)})


def set_decisions(plan: Plan) -> EndpointDecisions:
    """The plan's decisions, which must be a vLLM instance set's."""
    assert plan.decisions.kind == "set", plan.decisions.kind
    return plan.decisions


def cpu_decisions(plan: Plan) -> VllmCpuServer:
    """The only server of the plan, which must be a single CPU endpoint's."""
    server = plan.decisions.first
    assert plan.decisions.instances is None and isinstance(server, VllmCpuServer), server.kind
    return server


def with_decisions(plan: Plan, **update: object) -> Plan:
    """The plan with `update` applied to its decisions (units not rendered again): to its
    only server's, or to a set's service. Only fields: `model_copy` would keep any other key
    unseen (a property such as `vllm_args` is set through its stored field,
    `recorded_vllm_args`)."""
    decisions = plan.decisions
    if decisions.instances is not None:
        assert set(update) <= set(Endpoint.model_fields), sorted(update)
        return plan.model_copy(update={"decisions": decisions.model_copy(update=update)})
    server = decisions.first
    fields = set(type(server).model_fields)
    assert set(update) <= fields, sorted(set(update) - fields)
    changed = Endpoint.of_server(server.model_copy(update=update))
    return plan.model_copy(update={"decisions": changed})


def units_of(decisions: EndpointDecisions | AnyServer) -> dict[str, str]:
    """The units of an endpoint, or of the endpoint of one server."""
    return render_units(decisions_of(decisions))
