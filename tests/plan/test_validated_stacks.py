"""The validated vLLM + zentorch pairs (data/validated-stacks.json, `Stack.validated_stacks`):
the recipe's image and the embedded runtime. A host vLLM that is one of them is not warned
about; one that is none of them is, and the warning names them."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.errors import InputError
from epycd.host.facts import HostFacts, HostVllmFacts
from epycd.host.probe_cache import ProbeCache
from epycd.host.vllm_probe import parse_probe_output
from epycd.stack import load_stack, shipped_stack, stack_path
from tests.plan.conftest import QWEN3_0_6B_CONFIG, PlanWorkspace, cpu, write_model

REPO = Path(__file__).resolve().parents[2]
STACK = shipped_stack()
HostOf = Callable[..., HostFacts]
HOST_VLLM = 'runtime = "host"\nvllm = "/opt/env/bin/vllm"\n'


def probe_says(
    version: str, zentorch: str | None, platform: str = "ZenCpuPlatform"
) -> Callable[[str], HostVllmFacts]:
    def probe(executable: str) -> HostVllmFacts:
        return HostVllmFacts(
            path=executable,
            present=True,
            version=version,
            platform=platform,
            zentorch_version=zentorch,
        )

    return probe


def stack_warnings(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "not the pinned" in w or "not a validated stack" in w]


def test_the_shipped_pairs_are_the_image_and_the_embedded_runtime() -> None:
    pairs = {
        pair.name: (pair.vllm_version, pair.zentorch_version) for pair in STACK.validated_stacks
    }
    assert pairs == {
        "image": (STACK.vllm_version, STACK.zentorch_version),
        "embedded-runtime": ("0.32.0", "2.13.0.1"),
    }


def test_the_embedded_runtime_pair_is_the_recipes_pins() -> None:
    recipe = (REPO / "packaging" / "vllm-runtime.sh").read_text()
    pins = dict(re.findall(r"^(VLLM_VERSION|ZENTORCH_VERSION)=(\S+)$", recipe, re.MULTILINE))
    runtime = STACK.embedded_runtime
    assert pins == {
        "VLLM_VERSION": runtime.vllm_version,
        "ZENTORCH_VERSION": runtime.zentorch_version,
    }
    assert (REPO / "data" / "vllm" / f"{runtime.vllm_version}.json").is_file()


def test_the_pairs_are_outside_the_fingerprinted_bytes() -> None:
    """epyc.json's bytes are in every plan's fingerprint: the pairs live beside it."""
    assert "validated_stacks" not in json.loads(stack_path().read_text())
    assert STACK.content_sha256 == hashlib.sha256(stack_path().read_bytes()).hexdigest()


def test_a_pairs_file_without_the_image_pin_is_refused(tmp_path: Path) -> None:
    (tmp_path / "epyc.json").write_bytes(stack_path().read_bytes())
    data = json.loads((stack_path().parent / "validated-stacks.json").read_text())
    data["stacks"][0]["zentorch_version"] = "2.10.0"
    (tmp_path / "validated-stacks.json").write_text(json.dumps(data))
    with pytest.raises(InputError) as caught:
        load_stack(tmp_path / "epyc.json")
    assert caught.value.key == "validated_stacks"


def test_the_embedded_runtime_pair_is_not_warned_about(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm", HOST_VLLM)
    result = ws.plan(host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0+cpu", "2.13.0.1"))
    plan = cpu(result["llm"].plan)
    assert (plan.runtime, plan.backend, plan.vllm_version) == ("host", "zentorch", "0.32.0+cpu")
    assert stack_warnings(plan.warnings) == []


def test_the_embedded_runtime_on_the_stock_platform_is_not_warned_about(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """Built without zentorch where the CPU has no AVX-512 (the stock path asks consent)."""
    ws.endpoint("llm", HOST_VLLM)
    probe = probe_says("0.32.0+cpu", None, platform="CpuPlatform")
    plan = cpu(ws.plan(host_of("milan-7763-2s"), probe=probe)["llm"].plan)
    assert plan.backend == "stock" and plan.requires_confirmation
    assert stack_warnings(plan.warnings) == []


@pytest.mark.parametrize(
    ("version", "zentorch", "running"),
    [
        ("0.30.0", "2.13.0.1", "host vLLM 0.30.0 with zentorch 2.13.0.1"),
        ("0.32.0", "2.12.0", "host vLLM 0.32.0 with zentorch 2.12.0"),
        ("0.25.1", "2.13.0.1", "host vLLM 0.25.1 with zentorch 2.13.0.1"),
    ],
)
def test_a_host_vllm_off_the_pairs_is_warned_about_naming_them(
    ws: PlanWorkspace, host_of: HostOf, version: str, zentorch: str, running: str
) -> None:
    ws.endpoint("llm", HOST_VLLM)
    plan = cpu(
        ws.plan(host_of("genoa-9654-2s-nps1"), probe=probe_says(version, zentorch))["llm"].plan
    )
    [warning] = stack_warnings(plan.warnings)
    assert warning == f"{running} is not a validated stack; validated: {STACK.validated_text()}"
    assert "vLLM 0.25.1 with zentorch 2.11.0.3 (the recipe's image" in warning
    assert "vLLM 0.32.0 with zentorch 2.13.0.1 (the embedded runtime" in warning


def test_a_probe_that_did_not_say_its_zentorch_is_judged_by_the_image_pin(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """What the golden host cases hold (their probe names no zentorch): unchanged."""
    ws.endpoint("llm", HOST_VLLM)
    plan = cpu(ws.plan(host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0", None))["llm"].plan)
    assert stack_warnings(plan.warnings) == ["host vLLM 0.32.0 is not the pinned vLLM 0.25.1"]


def test_the_model_is_judged_by_the_serving_vllms_table(ws: PlanWorkspace, host_of: HostOf) -> None:
    """An architecture vLLM 0.32.0 added (not in 0.25.1's table) plans on the runtime."""
    model = write_model(
        ws.tmp / "qwen3_5", {**QWEN3_0_6B_CONFIG, "architectures": ["Qwen3_5ForCausalLM"]}
    )
    ws.endpoint("llm", f'model = "{model}"\n{HOST_VLLM}')
    result = ws.plan(host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0+cpu", "2.13.0.1"))
    assert result["llm"].plan is not None, [e.text for e in result["llm"].errors]
    facts = result["llm"].model_facts
    assert facts is not None
    assert (facts.support.vllm_version, facts.support.table_version) == ("0.32.0+cpu", "0.32.0")


def test_the_probe_reports_zentorch() -> None:
    facts = {"version": "0.32.0+cpu", "platform": "ZenCpuPlatform", "zentorch": "2.13.0.1"}
    line = "EPYCD-VLLM-PROBE " + json.dumps(facts)
    assert parse_probe_output(line) == ("0.32.0+cpu", "ZenCpuPlatform", "2.13.0.1")
    without = 'EPYCD-VLLM-PROBE {"version": "0.32.0", "platform": "CpuPlatform", "zentorch": null}'
    assert parse_probe_output(without).zentorch_version is None


def test_a_cached_probe_from_before_zentorch_was_asked_is_probed_again(tmp_path: Path) -> None:
    vllm = tmp_path / "env" / "bin" / "vllm"
    vllm.parent.mkdir(parents=True)
    for script in (vllm, vllm.parent / "python"):
        script.write_text("#!/bin/sh\nexit 1\n")
        script.chmod(0o755)
    asked: list[str] = []

    def prober(executable: str) -> HostVllmFacts:
        asked.append(executable)
        return probe_says("0.32.0", "2.13.0.1")(executable)

    cache = ProbeCache(tmp_path / "probes.json", prober)
    key = cache.key(str(vllm))
    assert key is not None
    old = {"path": str(vllm), "present": True, "version": "0.32.0", "platform": "ZenCpuPlatform"}
    (tmp_path / "probes.json").write_text(json.dumps({key: old}))
    assert cache.probe(str(vllm)).zentorch_version == "2.13.0.1"
    assert cache.probe(str(vllm)).zentorch_version == "2.13.0.1"
    assert asked == [str(vllm)]
