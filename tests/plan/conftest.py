"""Shared pieces of the planner tests: fake hosts with a runtime, local model folders,
endpoint files, settings pointing into tmp_path."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from epycd.engines.vllm.plan.argv import vllm_argv
from epycd.engines.vllm.plan.model import (
    VllmCpuServer,
    VllmInstinctServer,
    vllm_processes,
)
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, PodmanFacts, RuntimeFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.pipeline.build import PlanSources, plan_all
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.reservations import Held, Reservations
from epycd.render import render_for_plan
from epycd.settings import settings_model
from tests.hosts import make_host

QWEN3_0_6B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)
PODMAN_5 = PodmanFacts(
    present=True, version="5.4.2", rootful=True, quadlet=True, notify_healthy=True
)


def write_model(
    folder: Path, config: dict[str, object] | None = None, *, chat: bool = True
) -> Path:
    """A local model folder as the planner reads it: config.json and tokenizer_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or QWEN3_0_6B_CONFIG))
    tokenizer: dict[str, object] = {"model_max_length": 40960}
    if chat:
        tokenizer["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return folder


def fake_host(tmp_path: Path, name: str, runtimes: RuntimeFacts | None = None) -> HostFacts:
    root = make_host(tmp_path / "hosts", name)
    host = detect_host(root, probe_runtimes=False)
    return host.model_copy(update={"runtimes": runtimes or RuntimeFacts(podman=PODMAN_5)})


class PlanWorkspace:
    """A config folder, settings into tmp_path, a model folder; plans with no real ports."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.config_dir = tmp_path / "etc-epyc-llm"
        self.config_dir.mkdir()
        self.model = write_model(tmp_path / "models" / "qwen3-0.6b")
        self.hf_home = tmp_path / "hf"
        self.hf_home.mkdir()
        self.settings = settings_model()(
            config_dir=self.config_dir,
            state_dir=tmp_path / "state",
            run_dir=tmp_path / "run",
            unit_dir=tmp_path / "systemd",
            quadlet_dir=tmp_path / "containers-systemd",
            host_root=tmp_path,
        )

    def endpoint(self, name: str, text: str = "") -> Path:
        """Write NAME.toml; `model` defaults to the local model folder."""
        if not re.search(r"^model\s*=", text, re.MULTILINE):
            text = f'model = "{self.model}"\n' + text
        path = self.config_dir / f"{name}.toml"
        path.write_text(text)
        return path

    def plan(self, host: HostFacts, **kwargs: Any) -> dict[str, EndpointResult]:
        """`plan_all` with no listeners and this HF home. Keywords: `PlanSources` fields,
        `render`, `reservations`, or the held maps of `held_maps` for a test that holds
        something without an approved plan."""
        kwargs.setdefault("listeners", {})
        kwargs.setdefault("environ", {"HF_HOME": str(self.hf_home)})
        render = kwargs.pop("render", render_for_plan)
        reservations = kwargs.pop("reservations", None) or held_maps(
            **{key: kwargs.pop(key) for key in HELD_MAPS if key in kwargs}
        )
        sources = PlanSources(**kwargs)
        results = plan_all(
            self.settings, host, render=render, reservations=reservations, sources=sources
        )
        for result in results:
            if result.plan is not None:
                assert_invocations(result.plan)
        return {result.endpoint: result for result in results}


def assert_invocations(plan: Plan) -> None:
    """Every planned instance, a set's members included, has its typed invocation, and its
    `vllm_args` are that invocation's words."""
    for each in vllm_processes(plan.decisions):
        assert each.invocation is not None, each.unit_name
        assert vllm_argv(each.invocation) == each.vllm_args, each.unit_name


Planned = Plan | EndpointDecisions | None
"""A plan, or the decisions of one (an `EndpointResult`'s `plan` or `decisions`)."""


def _decisions(planned: Planned) -> EndpointDecisions:
    assert planned is not None
    return planned.decisions if isinstance(planned, Plan) else planned


def cpu(planned: Planned) -> VllmCpuServer:
    """The only server of an endpoint of one vLLM instance on CPUs."""
    decisions = _decisions(planned)
    server = decisions.first
    assert decisions.instances is None and isinstance(server, VllmCpuServer), decisions.kind
    return server


def instinct(planned: Planned) -> VllmInstinctServer:
    """The only server of an endpoint on Instinct GPUs."""
    decisions = _decisions(planned)
    server = decisions.first
    assert isinstance(server, VllmInstinctServer), decisions.kind
    return server


def instance_set(planned: Planned) -> EndpointDecisions:
    """The decisions, which must be those of a vLLM instance set behind its balancer."""
    decisions = _decisions(planned)
    assert decisions.kind == "set", decisions.kind
    return decisions


HELD_MAPS = ("approved_sockets", "approved_ports", "approved_gpus", "approved_instance_ports")


def held_maps(
    approved_sockets: Mapping[str, int] | None = None,
    approved_ports: Mapping[str, int] | None = None,
    approved_gpus: Mapping[str, list[int]] | None = None,
    approved_instance_ports: Mapping[str, list[int]] | None = None,
) -> Reservations:
    """Reservations holding what the maps say (endpoint -> socket, port, GPUs, instance
    ports), for tests of an approval whose plan is not at hand (its file is gone)."""
    sockets, ports = approved_sockets or {}, approved_ports or {}
    gpus, instance_ports = approved_gpus or {}, approved_instance_ports or {}
    names = {*sockets, *ports, *gpus, *instance_ports}
    return Reservations(
        {
            name: Held(
                endpoint=name,
                socket=sockets.get(name),
                port=ports.get(name),
                instance_ports=tuple(instance_ports.get(name, ())),
                gpus=tuple(gpus.get(name, ())),
            )
            for name in sorted(names)
        }
    )


@pytest.fixture
def ws(tmp_path: Path) -> PlanWorkspace:
    return PlanWorkspace(tmp_path)


@pytest.fixture
def host_of(tmp_path: Path) -> Callable[..., HostFacts]:
    def make(name: str, runtimes: RuntimeFacts | None = None) -> HostFacts:
        return fake_host(tmp_path, name, runtimes)

    return make
