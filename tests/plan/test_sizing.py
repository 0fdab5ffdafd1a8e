"""Memory fit against the chosen socket's own nodes, env and args the plan writes."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from epycd.engines.vllm.plan.tuning import kv_pool_gib
from epycd.host.facts import HostFacts
from epycd.stack import shipped_stack
from tests.plan.conftest import QWEN3_0_6B_CONFIG, PlanWorkspace, cpu, write_model

HostOf = Callable[..., HostFacts]
GIB = 1024**3
BIG = {**QWEN3_0_6B_CONFIG, "hidden_size": 8192, "intermediate_size": 28672,
       "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
       "head_dim": 128}  # fmt: skip


def test_fit_uses_the_nodes_memory_not_proc_meminfo(ws: PlanWorkspace, host_of: HostOf) -> None:
    """Like this machine: node0 has 10.8 GiB while /proc/meminfo says 23.5 GiB."""
    host = host_of("this-machine-genoa-vm")
    assert host.memory_gb > 20 and host.nodes[0].memory_total_bytes < 11 * GIB
    ws.endpoint("llm", "max_model_len = 4096\n")
    plan = cpu(ws.plan(host)["llm"].plan)
    assert plan.memory.fits
    node = host.nodes[0]
    assert plan.memory.available_gb == round(node.memory_available_bytes / GIB, 2)
    assert plan.kv_cache_gb <= kv_pool_gib(node.memory_total_bytes / GIB)
    assert plan.kv_cache_gb + plan.memory.weights_gb + plan.memory.headroom_gb <= (
        node.memory_available_bytes / GIB
    )
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == str(plan.kv_cache_gb)
    assert plan.kv_cache_gb >= 1


def test_short_first_node_still_plans_and_says_so(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("this-machine-genoa-vm")
    ws.endpoint("llm", "max_model_len = 4096\n")
    roomy = cpu(ws.plan(host)["llm"].plan)
    free = int((5 + roomy.memory.runtime_gb) * GIB)  # 5 GiB beside vLLM's own processes
    node = host.nodes[0].model_copy(update={"memory_available_bytes": free})
    short = host.model_copy(update={"nodes": [node]})
    plan = cpu(ws.plan(short)["llm"].plan)
    assert plan.memory.fits
    assert plan.memory.kv_pool_cap_gb < kv_pool_gib(node.memory_total_bytes / GIB)
    assert plan.max_num_seqs < 128
    assert any("max_num_seqs is" in w and "profile's 128" in w for w in plan.warnings)


def test_a_model_too_big_for_the_socket_is_refused_with_the_sizing(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    big = write_model(tmp_path / "models" / "big", BIG)
    path = ws.endpoint("big", f'model = "{big}"\n')
    result = ws.plan(host_of("this-machine-genoa-vm"))["big"]
    assert result.exit_code == 1 and result.plan is None
    assert not cpu(result.decisions).memory.fits
    assert cpu(result.decisions).memory.weights_gb > 100
    error = result.errors[0]
    assert (error.file, error.key) == (str(path), "max_model_len")
    assert "does not fit" in error.message and "smaller" in (error.fix or "")


def test_a_context_too_long_for_the_pool_suggests_a_shorter_one(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("long", "max_model_len = 40960\nmax_num_seqs = 64\n")
    result = ws.plan(host_of("this-machine-genoa-vm"))["long"]
    assert result.exit_code == 1
    suggested = cpu(result.decisions).memory.suggested_max_model_len
    assert suggested is not None and 0 < suggested < 40960
    assert str(suggested) in (result.errors[0].fix or "")


def test_the_same_model_fits_a_big_socket(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    big = write_model(tmp_path / "models" / "big", BIG)
    ws.endpoint("big", f'model = "{big}"\n')
    plan = cpu(ws.plan(host_of("genoa-9654-2s-nps1"))["big"].plan)
    assert plan.memory.fits
    stack = shipped_stack()
    weights_gib = math.ceil(plan.memory.weights_gb)
    assert plan.start_timeout_s == (
        stack.start_timeout.base_s + weights_gib * stack.start_timeout.per_weights_gib_s
    )


def test_default_context_is_the_stack_default_capped_by_the_model(
    ws: PlanWorkspace, host_of: HostOf, tmp_path: Path
) -> None:
    config = {**QWEN3_0_6B_CONFIG, "max_position_embeddings": 2048}
    short = write_model(tmp_path / "models" / "short", config)
    ws.endpoint("default")
    ws.endpoint("short", f'model = "{short}"\nmax_model_len = 8192\n')
    results = ws.plan(host_of("genoa-9654-2s-nps1"))
    default, capped = cpu(results["default"].plan), cpu(results["short"].plan)
    assert default.max_model_len == 4096
    assert capped.max_model_len == 2048
    assert any("capped" in w for w in capped.warnings)


def test_env_and_args_the_plan_writes(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint(
        "llm",
        'dtype = "float32"\nmax_num_seqs = 2\nport = 8123\nserved_model_name = "q"\n'
        'throughput_flags = true\nrestart = "on-failure"\n'
        'extra_args = ["--enforce-eager"]\n[env]\nVLLM_LOGGING_LEVEL = "DEBUG"\n',
    )
    planned = ws.plan(host_of("genoa-9654-2s-nps1"))["llm"].plan
    plan = cpu(planned)
    assert plan.env == {
        "VLLM_CPU_OMP_THREADS_BIND": plan.omp_cpus,
        "VLLM_CPU_KVCACHE_SPACE": str(plan.kv_cache_gb),
        "TORCHINDUCTOR_FREEZING": "1",
        "VLLM_USE_AOT_COMPILE": "0",
        "ZENTORCH_WEIGHT_PREPACK": "1",
        "VLLM_LOGGING_LEVEL": "DEBUG",
    }
    assert plan.vllm_args == [
        str(ws.model), "--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "2",
        "--max-num-batched-tokens", "2048", "--stream-interval", "4", "--host", "127.0.0.1",
        "--port", "8123", "--served-model-name", "q", "--enforce-eager",
    ]  # fmt: skip
    assert plan.restart == "on-failure" and plan.port == 8123
    assert not any(a.startswith("--device") for a in plan.vllm_args)
    assert "OMP_NUM_THREADS" not in plan.env
    assert plan.run_flags == ["--ipc=host", "--network=host", "--cap-add=SYS_NICE"]
    assert planned is not None
    text = planned.units["epyc-llm-llm.container"]
    assert "--shm-size" not in text and "TORCHINDUCTOR_FREEZING=1" in text


def test_a_socket_1_gib_too_small_for_the_servers_footprint_is_refused_with_the_numbers(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Rule 7: the socket holds weights + the smallest KV pool + headroom, and 1 GiB less
    than that plus vLLM's own measured processes (data/footprint): refused, with the figures.
    Before, the runtime was not counted and this socket "fit"."""
    ws.endpoint("llm", "max_model_len = 4096\n")
    roomy = cpu(ws.plan(host_of("this-machine-genoa-vm"))["llm"].plan)
    assert roomy.memory.runtime_gb > 1.0
    fit = roomy.memory
    footprint = fit.weights_gb + fit.runtime_gb + 1  # the smallest pool is 1 GiB
    socket = footprint + 2.0 - 1.0  # headroom of a socket under 20 GiB: 2 GiB
    assert fit.weights_gb + 1 + 2.0 < socket, "the old rule (no runtime) accepts this socket"
    host = host_of("this-machine-genoa-vm")
    size = int(socket * GIB)
    node = host.nodes[0].model_copy(
        update={"memory_total_bytes": size, "memory_available_bytes": size}
    )
    small = host.model_copy(update={"nodes": [node]})
    result = ws.plan(small)["llm"]
    assert result.exit_code == 1 and result.plan is None
    assert not cpu(result.decisions).memory.fits
    message, fix = result.errors[0].message, result.errors[0].fix or ""
    assert f"vLLM's own {fit.runtime_gb}" in message and f"weights {fit.weights_gb}" in message
    assert f"{socket:.2f} GiB available" in fix and "vLLM's own processes" in fix
