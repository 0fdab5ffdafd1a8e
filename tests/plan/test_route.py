"""Routing by CPU, the stack gate on the probed host vLLM, and runtime choice."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epycd.host.facts import DockerFacts, HostFacts, HostVllmFacts, PodmanFacts, RuntimeFacts
from epycd.stack import shipped_stack
from tests.plan.conftest import PlanWorkspace, cpu

STACK = shipped_stack()
HostOf = Callable[..., HostFacts]


def probe_says(platform: str, version: str = "0.25.1") -> Callable[[str], HostVllmFacts]:
    def probe(executable: str) -> HostVllmFacts:
        return HostVllmFacts(path=executable, present=True, version=version, platform=platform)

    return probe


def test_genoa_takes_the_validated_zentorch_image(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm")
    plan = cpu(ws.plan(host_of("genoa-9654-2s-nps1"))["llm"].plan)
    assert (plan.backend, plan.runtime, plan.image) == ("zentorch", "podman", STACK.image)
    assert not plan.image_entrypoint_is_vllm_serve
    assert not plan.requires_confirmation and plan.confirmation_reasons == []
    assert plan.vllm_version == "0.25.1"


@pytest.mark.parametrize("name", ["turin-9965", "venice-256c"])
def test_turin_and_venice_on_the_pinned_stack_need_no_consent(
    ws: PlanWorkspace, host_of: HostOf, name: str
) -> None:
    ws.endpoint("llm")
    plan = cpu(ws.plan(host_of(name))["llm"].plan)
    assert plan.backend == "zentorch" and not plan.requires_confirmation


def test_milan_gets_the_stock_image_with_consent(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm")
    plan = cpu(ws.plan(host_of("milan-7763-2s"))["llm"].plan)
    assert plan.backend == "stock"
    assert plan.image == "docker.io/vllm/vllm-openai-cpu:v0.25.1-x86_64"
    assert plan.image_entrypoint_is_vllm_serve
    assert plan.requires_confirmation
    assert "AVX-512 BF16" in plan.confirmation_reasons[0]
    assert "zentorch" not in " ".join(plan.env)


def test_an_own_image_on_milan_is_unvalidated_stock_with_consent(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """An admin's own vLLM CPU image on a CPU without AVX-512 BF16: consent that says why
    (zentorch inside it stays off, vLLM runs its stock platform), not a refusal."""
    ws.endpoint("llm", 'image = "registry.example/team/vllm-cpu:0.32.0"\n')
    result = ws.plan(host_of("milan-7763-2s"))["llm"]
    assert result.plan is not None, [e.text for e in result.errors]
    plan = cpu(result.plan)
    assert (plan.backend, plan.image) == ("stock", "registry.example/team/vllm-cpu:0.32.0")
    assert not plan.image_entrypoint_is_vllm_serve, "an own image is given `vllm serve`"
    assert plan.requires_confirmation
    [own] = [r for r in plan.confirmation_reasons if "not one the product knows" in r]
    assert "stock CpuPlatform" in own and "Milan" in own
    assert "zentorch" not in " ".join(plan.env).lower()


def test_the_zentorch_image_on_milan_is_refused_naming_the_stock_one(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    path = ws.endpoint("llm", f'image = "{STACK.image}"\n')
    result = ws.plan(host_of("milan-7763-2s"))["llm"]
    assert result.plan is None and result.exit_code == 1
    assert (result.errors[0].file, result.errors[0].key) == (str(path), "image")
    assert "built for zentorch" in result.errors[0].message
    assert STACK.stock_image_pinned in (result.errors[0].fix or "")


@pytest.mark.parametrize("name", ["bergamo-9754", "epyc-4584px"])
def test_bf16_outside_genoa_turin_venice_is_unvalidated_zentorch(
    ws: PlanWorkspace, host_of: HostOf, name: str
) -> None:
    ws.endpoint("llm")
    plan = cpu(ws.plan(host_of(name))["llm"].plan)
    assert plan.backend == "zentorch" and plan.image == STACK.image
    assert plan.requires_confirmation
    assert "not validated" in plan.confirmation_reasons[0]


def test_bergamo_may_choose_the_stock_image_with_consent(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("llm", 'image = "vllm/vllm-openai-cpu:latest-x86_64"\n')
    plan = cpu(ws.plan(host_of("bergamo-9754"))["llm"].plan)
    assert plan.backend == "stock" and plan.requires_confirmation
    assert plan.image == "docker.io/vllm/vllm-openai-cpu:latest-x86_64"
    assert plan.image_entrypoint_is_vllm_serve
    assert any("not pinned" in w for w in plan.warnings)


def test_xeon_is_refused_naming_the_cpu(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm")
    result = ws.plan(host_of("xeon"))["llm"]
    assert result.plan is None and result.exit_code == 1
    assert "Intel(R) Xeon(R) Platinum 8480+" in result.errors[0].text
    assert "GenuineIntel" in result.errors[0].text


def test_stock_image_on_genoa_is_blocked(ws: PlanWorkspace, host_of: HostOf) -> None:
    path = ws.endpoint("llm", 'image = "vllm/vllm-openai-cpu:v0.25.1-x86_64"\n')
    result = ws.plan(host_of("genoa-9654-2s-nps1"))["llm"]
    assert result.exit_code == 1
    assert (result.errors[0].file, result.errors[0].key) == (str(path), "image")
    assert "blocked" in result.errors[0].message


def test_host_vllm_on_the_zen_platform_proceeds(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm", 'runtime = "host"\nvllm = "/opt/zen/bin/vllm"\n')
    planned = ws.plan(host_of("genoa-9654-2s-nps1"), probe=probe_says("ZenCpuPlatform"))["llm"]
    plan = cpu(planned.plan)
    assert (plan.runtime, plan.backend, plan.image) == ("host", "zentorch", None)
    assert plan.vllm_executable == "/opt/zen/bin/vllm"
    assert plan.run_flags == [] and plan.hf_cache is None
    assert "HF_HOME" not in plan.env and plan.extra_mounts == []
    assert plan.vllm_args[0] == str(ws.model)
    assert planned.plan is not None and list(planned.plan.units) == ["epyc-llm-llm.service"]


@pytest.mark.parametrize("name", ["genoa-9654-2s-nps1", "turin-9965", "venice-256c"])
def test_host_vllm_on_the_stock_platform_is_stock_with_consent_on_a_zentorch_host(
    ws: PlanWorkspace, host_of: HostOf, name: str
) -> None:
    """An admin may choose a plain vLLM on purpose: consent, not a dead end; the reason says
    that zentorch is off, what that costs and how to get it."""
    ws.endpoint("llm", 'runtime = "host"\nvllm = "/opt/plain/bin/vllm"\n')
    result = ws.plan(host_of(name), probe=probe_says("CpuPlatform", "0.25.1"))["llm"]
    assert result.plan is not None, [e.text for e in result.errors]
    plan = cpu(result.plan)
    assert (plan.runtime, plan.backend) == ("host", "stock")
    assert plan.requires_confirmation
    [reason] = plan.confirmation_reasons
    assert "runs CpuPlatform, not the Zen platform" in reason
    assert "zentorch acceleration is off" in reason
    assert f"install zentorch {STACK.zentorch_version}" in reason
    assert STACK.image in reason
    assert "zentorch" not in " ".join(plan.env).lower()


def test_host_vllm_on_the_stock_platform_is_stock_with_consent_on_milan(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("llm", 'runtime = "host"\nvllm = "/opt/plain/bin/vllm"\n')
    plan = cpu(
        ws.plan(host_of("milan-7763-2s"), probe=probe_says("CpuPlatform", "0.29.0"))["llm"].plan
    )
    assert plan.backend == "stock" and plan.requires_confirmation
    assert plan.vllm_version == "0.29.0"
    [warning] = [w for w in plan.warnings if "host vLLM 0.29.0" in w]
    assert "is not a validated stack" in warning
    assert "vLLM 0.25.1 with zentorch 2.11.0.3" in warning
    assert "vLLM 0.32.0 with zentorch 2.13.0.1" in warning


def test_venice_off_the_pinned_vllm_needs_consent(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm", 'runtime = "host"\nvllm = "/opt/zen/bin/vllm"\n')
    venice = host_of("venice-256c")
    plan = cpu(ws.plan(venice, probe=probe_says("ZenCpuPlatform", "0.26.0"))["llm"].plan)
    assert plan.requires_confirmation
    assert "Venice" in plan.confirmation_reasons[0]
    pinned = cpu(ws.plan(venice, probe=probe_says("ZenCpuPlatform", "0.25.1+cpu"))["llm"].plan)
    assert not pinned.requires_confirmation


AUTO_CASES = [
    (RuntimeFacts(podman=PodmanFacts(present=True, version="5.4.2", quadlet=True),
                  docker=DockerFacts(present=True, daemon_reachable=True)), "podman"),
    (RuntimeFacts(podman=PodmanFacts(present=True, version="4.3.1", quadlet=False),
                  docker=DockerFacts(present=True, daemon_reachable=True)), "docker"),
    (RuntimeFacts(podman=PodmanFacts(present=True, version="4.3.1", quadlet=False),
                  docker=DockerFacts(present=True, daemon_reachable=False)), "host"),
]  # fmt: skip


@pytest.mark.parametrize(("runtimes", "expected"), AUTO_CASES)
def test_auto_runtime_prefers_quadlet_then_docker_then_host(
    ws: PlanWorkspace, host_of: HostOf, runtimes: RuntimeFacts, expected: str
) -> None:
    ws.endpoint("llm", 'vllm = "/opt/zen/bin/vllm"\n')
    result = ws.plan(host_of("genoa-9654-2s-nps1", runtimes), probe=probe_says("ZenCpuPlatform"))
    plan = cpu(result["llm"].plan)
    assert plan.runtime == expected


def test_no_runtime_at_all_is_refused_with_the_one_time_fix(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("llm")
    result = ws.plan(host_of("genoa-9654-2s-nps1", RuntimeFacts()))["llm"]
    assert result.exit_code == 1
    assert "no container runtime" in result.errors[0].message
    assert "podman" in (result.errors[0].fix or "")


@pytest.mark.parametrize(
    ("runtime", "facts", "says"),
    [
        ("podman", RuntimeFacts(), "podman is not installed"),
        ("podman", RuntimeFacts(podman=PodmanFacts(present=True, version="4.3.1")), "Quadlet"),
        ("docker", RuntimeFacts(), "docker is not installed"),
        ("docker", RuntimeFacts(docker=DockerFacts(present=True)), "does not answer"),
    ],
)
def test_explicit_runtime_that_is_not_there_is_a_clear_error(
    ws: PlanWorkspace, host_of: HostOf, runtime: str, facts: RuntimeFacts, says: str
) -> None:
    path = ws.endpoint("llm", f'runtime = "{runtime}"\n')
    result = ws.plan(host_of("genoa-9654-2s-nps1", facts))["llm"]
    assert result.plan is None
    error = result.errors[0]
    assert (error.file, error.key) == (str(path), "runtime") and says in error.message


def test_host_vllm_that_cannot_be_probed_is_an_error(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm", 'runtime = "host"\nvllm = "/nowhere/bin/vllm"\n')

    def absent(executable: str) -> HostVllmFacts:
        return HostVllmFacts(path=executable, present=False, error="no such executable")

    result = ws.plan(host_of("genoa-9654-2s-nps1"), probe=absent)["llm"]
    assert result.errors[0].key == "vllm" and "no such executable" in result.errors[0].message


def test_a_vllm_plan_without_avx512_says_what_llama_cpp_serves_there(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """vLLM's AVX2 path served 14-30x fewer tokens/s than llama.cpp on a Milan: a vLLM
    endpoint there is planned, with the figure and the way to the faster engine."""
    ws.endpoint("llm")
    plan = cpu(ws.plan(host_of("milan-7763-2s"))["llm"].plan)
    [warning] = [w for w in plan.warnings if "no AVX-512" in w]
    assert "14-30x fewer tokens/s than llama.cpp" in warning
    assert "install.sh --engine llama.cpp" in warning
    genoa = cpu(ws.plan(host_of("genoa-9654-2s-nps1"))["llm"].plan)
    assert not [w for w in genoa.warnings if "no AVX-512" in w]
