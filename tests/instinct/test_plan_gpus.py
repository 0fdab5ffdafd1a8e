"""Planning Instinct GPU endpoints (docs/instinct.md): GPUs, tensor parallel size, the CPU pin
of the GPUs' NUMA nodes, CPU endpoints kept off those cores, the recipe's env and args,
refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import Plan
from epycd.plan.healing import healing_for
from epycd.plan.pipeline.result import EndpointResult
from tests.hosts import CATALOGUE, MI210, FakeGpu, HostShape, gpus_on_nodes
from tests.instinct.conftest import DOCKER
from tests.plan.conftest import PlanWorkspace, instinct, write_model
from tests.plan.conftest import cpu as cpu_decisions

HostOf = Callable[..., HostFacts]
LLAMA_70B = 'model = "meta-llama/Llama-3.1-70B-Instruct"\n'
QWEN = 'model = "Qwen/Qwen3-0.6B"\n'
GPU = 'device = "instinct"\n'
BERT_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 384,
               "num_hidden_layers": 6, "num_attention_heads": 12,
               "max_position_embeddings": 512, "vocab_size": 30522}  # fmt: skip


def token(ws: PlanWorkspace) -> str:
    return f'hf_token_file = "{ws.tmp / "secrets" / "hf.token"}"\n'


def planned(result: EndpointResult) -> Plan:
    assert result.plan is not None, [p.text for p in result.errors]
    return result.plan


def refused(result: EndpointResult) -> str:
    assert result.plan is None and result.errors, result
    return " | ".join(p.text for p in result.errors)


def node_cpus(host: HostFacts, nodes: list[int]) -> set[int]:
    return {cpu for node in nodes for cpu in host.node(node).cpus}


def test_mi300x_gpu_and_cpu_endpoints_share_no_core(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    ws.endpoint("gpu", GPU + QWEN)
    ws.endpoint("gpu2", GPU + QWEN + "gpus = [5]\n")
    ws.endpoint("cpu", QWEN)
    results = ws.plan(host)
    gpu, gpu2 = (instinct(planned(results[n])) for n in ("gpu", "gpu2"))
    cpu = cpu_decisions(planned(results["cpu"]))
    assert (gpu.gpus, gpu.tensor_parallel_size, gpu.numa_nodes) == ([0], 1, [0])
    assert (gpu2.gpus, gpu2.numa_nodes, gpu2.socket) == ([5], [5], 1)
    assert set(parse_cpulist(gpu.cpus)) == node_cpus(host, [0])
    assert set(parse_cpulist(gpu2.cpus)) == node_cpus(host, [5])
    assert gpu.env["HIP_VISIBLE_DEVICES"] == "0" and gpu2.env["HIP_VISIBLE_DEVICES"] == "5"
    assert gpu.env["VLLM_ROCM_USE_AITER_FP4BMM"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in gpu.env
    assert not set(parse_cpulist(cpu.cpus)) & (node_cpus(host, [0]) | node_cpus(host, [5]))
    assert not set(cpu.numa_nodes) & {0, 5}
    assert gpu.port != gpu2.port != cpu.port


def test_two_auto_endpoints_take_different_gpus(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a", GPU + QWEN)
    ws.endpoint("b", GPU + QWEN)
    results = ws.plan(host_of("genoa-2s-8x-mi300x"))
    assert planned(results["a"]).gpus == [0]
    assert planned(results["b"]).gpus == [1]


def test_a_gpu_listed_twice_is_refused(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("a", GPU + QWEN + "gpus = [3]\n")
    ws.endpoint("b", GPU + QWEN + "gpus = [3]\n")
    results = ws.plan(host_of("genoa-2s-8x-mi300x"))
    assert planned(results["a"]).gpus == [3]
    assert "GPU 3 serves a" in refused(results["b"])


def test_mi355x_explicit_pair_tensor_parallel_2(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("turin-2s-8x-mi355x", DOCKER)
    ws.endpoint("llama", GPU + LLAMA_70B + token(ws) + "gpus = [2, 3]\n")
    plan = planned(ws.plan(host)["llama"])
    decisions = instinct(plan)
    assert (
        decisions.gpus,
        decisions.tensor_parallel_size,
        decisions.numa_nodes,
        decisions.socket,
    ) == (
        [2, 3],
        2,
        [0],
        0,
    )
    assert decisions.runtime == "docker" and decisions.gfx_version == "gfx950"
    assert decisions.env["HIP_VISIBLE_DEVICES"] == "2,3"
    assert "VLLM_ROCM_USE_AITER_FP4BMM" not in decisions.env
    args = decisions.vllm_args
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    text = next(iter(plan.units.values()))
    for flag in ("--device=/dev/kfd", "--device=/dev/dri", "--group-add=video",
                 "--group-add=render", "--cap-add=SYS_PTRACE",
                 "--security-opt=seccomp=unconfined", "--ipc=host"):  # fmt: skip
        assert flag in text, flag
    assert "CUDA_VISIBLE_DEVICES" not in text


def test_instinct_endpoints_heal_like_cpu_endpoints(ws: PlanWorkspace, host_of: HostOf) -> None:
    """docs/healing.md: over docker the supervisor's watchdog, on podman 5 the health check
    that kills the container; both restart on failure within their own start budget."""
    ws.endpoint("gpu", GPU + QWEN)
    podman = planned(ws.plan(host_of("genoa-2s-8x-mi300x"))["gpu"])
    on_podman = instinct(podman)
    assert on_podman.runtime == "podman"
    assert on_podman.healing == healing_for(
        "on-failure", on_podman.start_timeout_s, supervised=False
    )
    assert "HealthOnFailure=kill" in podman.units["epyc-llm-gpu.container"]
    docker = planned(ws.plan(host_of("turin-2s-8x-mi355x", DOCKER))["gpu"])
    on_docker = instinct(docker)
    assert on_docker.runtime == "docker"
    assert on_docker.healing == healing_for(
        "on-failure", on_docker.start_timeout_s, supervised=True
    )
    text = docker.units["epyc-llm-gpu.service"]
    assert "\nWatchdogSec=30s\n" in text and " --stall-timeout 120 -- " in text


def test_auto_tensor_parallel_is_the_smallest_power_of_two_that_fits(
    ws: PlanWorkspace, shape_host: Callable[[HostShape], HostFacts]
) -> None:
    """Llama 3.1 70B (131.4 GiB) on 64 GiB MI210s: TP 2 leaves no room, TP 4 does."""
    four = replace(CATALOGUE["genoa-1x-mi210"], gpus=gpus_on_nodes(MI210, [0, 0, 0, 0]))
    ws.endpoint("llama", GPU + LLAMA_70B + token(ws))
    plan = instinct(planned(ws.plan(shape_host(four))["llama"]))
    assert (plan.tensor_parallel_size, plan.gpus) == (4, [0, 1, 2, 3])
    assert plan.gpu_fit is not None and plan.gpu_fit.tier == "safe"
    assert plan.env["HIP_VISIBLE_DEVICES"] == "0,1,2,3"


def test_a_model_too_big_for_all_gpus_is_refused(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llama", GPU + LLAMA_70B + token(ws))
    result = ws.plan(host_of("genoa-1x-mi210"))["llama"]
    text = refused(result)
    assert result.exit_code == 1
    assert "too big for all 1 AMD Instinct MI210 GPU(s)" in text
    assert "quantized variant" in text


def test_explicit_tp_too_small_names_the_one_that_fits(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llama", GPU + LLAMA_70B + token(ws) + "tensor_parallel_size = 1\n")
    ws.endpoint("ok", GPU + 'model = "meta-llama/Llama-3.1-8B-Instruct"\n' + token(ws))
    results = ws.plan(host_of("genoa-1x-mi210"))
    assert "tensor_parallel_size" in refused(results["llama"])
    assert planned(results["ok"]).gpus == [0]


def test_tight_vram_starts_eager(
    ws: PlanWorkspace, shape_host: Callable[[HostShape], HostFacts]
) -> None:
    """Llama 3.1 8B (15 GiB) on a 22 GiB GPU: 3 GiB left for KV, between 2 and 6."""
    small = replace(CATALOGUE["genoa-1x-mi210"], gpus=(FakeGpu(90402, 22, 0),))
    ws.endpoint("llama", GPU + 'model = "meta-llama/Llama-3.1-8B-Instruct"\n' + token(ws))
    plan = instinct(planned(ws.plan(shape_host(small))["llama"]))
    assert plan.gpu_fit is not None and plan.gpu_fit.tier == "tight"
    assert "--enforce-eager" in plan.vllm_args
    assert any("--enforce-eager" in w for w in plan.warnings)


def test_too_tight_vram_is_refused(
    ws: PlanWorkspace, shape_host: Callable[[HostShape], HostFacts]
) -> None:
    small = replace(CATALOGUE["genoa-1x-mi210"], gpus=(FakeGpu(90402, 20, 0),))
    ws.endpoint("llama", GPU + 'model = "meta-llama/Llama-3.1-8B-Instruct"\n' + token(ws))
    assert "quantized variant" in refused(ws.plan(shape_host(small))["llama"])


def test_a_model_that_is_no_llm_endpoint_is_refused_with_an_alternative(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("asr", GPU + 'model = "openai/whisper-large-v3"\n')
    result = ws.plan(host_of("genoa-2s-8x-mi300x"))["asr"]
    (problem,) = result.errors
    assert result.exit_code == 1 and problem.key == "model"
    assert "not an LLM endpoint" in problem.message and "audio" in problem.message
    assert problem.fix and "Qwen/Qwen3.5-9B" in problem.fix


def test_mi210_needs_consent(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("qwen", GPU + QWEN)
    plan = instinct(planned(ws.plan(host_of("genoa-1x-mi210"))["qwen"]))
    assert plan.requires_confirmation
    assert any("gfx90a" in reason for reason in plan.confirmation_reasons)


def test_no_gpu_host_refuses_an_instinct_endpoint(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("gpu", GPU + QWEN)
    ws.endpoint("cpu", QWEN)
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    assert "no AMD GPU on this host" in refused(results["gpu"])
    assert isinstance(planned(results["cpu"]).decisions.first, VllmCpuServer)


def test_a_gpu_that_does_not_exist(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("gpu", GPU + QWEN + "gpus = [8]\n")
    result = ws.plan(host_of("genoa-2s-8x-mi300x"))["gpu"]
    assert result.exit_code == 2 and "GPU 8 does not exist" in refused(result)


def test_gpu_keys_on_a_cpu_endpoint_and_host_runtime_are_bad_input(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("a", QWEN + "gpus = [0]\n")
    ws.endpoint("b", GPU + QWEN + 'runtime = "host"\n')
    ws.endpoint("c", GPU + QWEN + "tensor_parallel_size = 3\n")
    results = ws.plan(host_of("genoa-2s-8x-mi300x"))
    for name in ("a", "b", "c"):
        assert results[name].exit_code == 2, name
    assert 'device = "instinct"' in refused(results["a"])
    assert "container" in refused(results["b"])


def test_a_changed_gpu_changes_the_inputs_fingerprint(
    ws: PlanWorkspace, shape_host: Callable[[HostShape], HostFacts], tmp_path: Path
) -> None:
    """Drift: another gfx (or a GPU gone) is a new plan to approve, for the GPU endpoint."""
    ws.endpoint("gpu", GPU + QWEN)
    base = CATALOGUE["genoa-1x-mi210"]
    before = planned(ws.plan(shape_host(base))["gpu"])
    other = replace(base, gpus=(FakeGpu(90402, 64, 0),))
    after = planned(ws.plan(shape_host(other))["gpu"])
    assert before.inputs_fingerprint != after.inputs_fingerprint


def test_plan_table_and_hand_off_speak_of_gpus(ws: PlanWorkspace, host_of: HostOf) -> None:
    from epycd.cli.plan import confirmation_table
    from epycd.cli.status import handoff_text
    from epycd.status.handoff import handoff

    host = host_of("genoa-2s-8x-mi300x")
    ws.endpoint("gpu", GPU + QWEN + "gpus = [4]\n")
    result = ws.plan(host)["gpu"]
    text = confirmation_table(result, host)
    assert "VRAM fit" in text and "tensor parallel 1" in text
    assert "Instinct gfx942 GPU(s) 4 (HIP_VISIBLE_DEVICES)" in text
    assert "ROCm vLLM on AMD Instinct GPUs" in text
    assert "OpenMP bind" not in text
    assert "Instinct GPU(s) 4 (CPUs " in handoff_text(handoff(planned(result)))


def test_approved_gpu_endpoints_keep_their_gpus_and_nodes(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """An approved endpoint keeps its GPUs when a new file sorts before it; one whose file is
    gone still holds its GPU and its node's cores."""
    host = host_of("genoa-2s-8x-mi300x")
    ws.endpoint("a-new", GPU + QWEN)
    ws.endpoint("b-approved", GPU + QWEN)
    ws.endpoint("cpu", QWEN + "socket = 0\n")
    results = ws.plan(host, approved_gpus={"b-approved": [3], "gone": [0]})
    assert planned(results["b-approved"]).gpus == [3]
    assert planned(results["a-new"]).gpus == [1]
    cpu = cpu_decisions(planned(results["cpu"]))
    assert cpu.numa_nodes == [2]
    assert not set(parse_cpulist(cpu.cpus)) & node_cpus(host, [0, 1, 3])


def test_a_tensor_parallel_size_beyond_the_free_gpus_is_refused_not_shrunk(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Eight MI300X, six held by two endpoints: another that asks for tensor parallel size 4
    is refused on `gpus`, rather than placed on the two left with vLLM told 4."""
    ws.endpoint("quad", GPU + QWEN + "gpus = [0, 1, 2, 3]\n")
    ws.endpoint("pair", GPU + QWEN + "gpus = [4, 5]\n")
    ws.endpoint("four", GPU + QWEN + "tensor_parallel_size = 4\n")
    results = ws.plan(host_of("genoa-2s-8x-mi300x"))
    assert planned(results["quad"]).gpus == [0, 1, 2, 3]
    text = refused(results["four"])
    assert "tensor parallel size 4" in text and "only 2" in text
    assert results["four"].errors[0].key == "gpus"


def test_an_embedding_model_on_instinct_gpus_is_refused_naming_the_device(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Instinct endpoints serve the recipe's LLMs; an embedder is the CPU's, and the file is
    told so while the endpoint beside it plans."""
    bert = write_model(ws.tmp / "models" / "bert", BERT_CONFIG)
    path = ws.endpoint("pooled", GPU + f'model = "{bert}"\n')
    ws.endpoint("gpu", GPU + QWEN)
    results = ws.plan(host_of("genoa-2s-8x-mi300x"))
    [problem] = results["pooled"].errors
    assert (problem.file, problem.key) == (str(path), "device")
    assert "on the CPU" in problem.text and 'device = "cpu"' in (problem.fix or "")
    planned(results["gpu"])
