"""What a host endpoint, running as the user epyc-llm with ProtectHome=, needs from /root and
/home: its vLLM environment's base interpreter (pyenv), a local model there; and its HF
cache moved out of root's home (the real planner on a fake host)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from epycd.host.facts import HostFacts, HostVllmFacts
from epycd.plan.model import HfCacheMount
from epycd.plan.service.hfcache import ENDPOINT_HF_HOME, host_hf_home
from epycd.plan.service.homes import home_read_paths, in_a_home
from tests.plan.conftest import PlanWorkspace, cpu


def venv(root: Path, base_bin: str) -> str:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "vllm").write_text("#!/bin/sh\n")
    (root / "pyvenv.cfg").write_text(f"home = {base_bin}\nversion = 3.11.7\n")
    return str(root / "bin" / "vllm")


def test_a_pyenv_interpreter_and_a_model_in_a_home_are_named(tmp_path: Path) -> None:
    vllm = venv(tmp_path / "opt" / "env", "/root/.pyenv/versions/3.11.7/bin")
    paths = home_read_paths(vllm, ["/home/ann/models/qwen", "/srv/models/x"])
    assert paths == ["/home/ann/models/qwen", "/root/.pyenv/versions/3.11.7"]


def test_a_system_interpreter_and_model_need_nothing(tmp_path: Path) -> None:
    vllm = venv(tmp_path / "opt" / "env", "/usr/bin")
    assert home_read_paths(vllm, ["/srv/models/x"]) == []
    assert not in_a_home("/rootless") and in_a_home("/root") and in_a_home("/home/a")


def test_root_s_hf_cache_becomes_the_endpoints_own() -> None:
    assert host_hf_home(HfCacheMount(host_path="/root/.cache/huggingface")) == ENDPOINT_HF_HOME
    assert host_hf_home(HfCacheMount(host_path="/srv/hf")) == "/srv/hf"


def test_the_planner_moves_the_hf_cache_and_says_so(
    ws: PlanWorkspace, host_of: Callable[..., HostFacts]
) -> None:
    ws.endpoint("qwen", 'model = "Qwen/Qwen3-0.6B"\nruntime = "host"\nvllm = "/opt/zen/bin/vllm"\n')

    def zen(executable: str) -> HostVllmFacts:
        return HostVllmFacts(
            path=executable, present=True, version="0.32.0", platform="ZenCpuPlatform"
        )

    from tests.plan.test_model_paths import hub_from

    whole_plan = ws.plan(
        host_of("genoa-9654-2s-nps1"),
        inspect=hub_from(ws.model),
        probe=zen,
        environ={"HF_HOME": "/root/.cache/huggingface"},
    )["qwen"].plan
    assert whole_plan is not None
    plan = cpu(whole_plan)
    assert plan.env["HF_HOME"] == ENDPOINT_HF_HOME
    assert any("out of the endpoint's reach" in warning for warning in plan.warnings)
    unit = next(iter(whole_plan.units.values()))
    assert "CacheDirectory=epyc-llm/endpoints/qwen epyc-llm/huggingface" in unit
    assert plan.status_file == str(ws.settings.run_dir / "endpoints" / "qwen" / "status.json")
