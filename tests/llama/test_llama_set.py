"""A planned llama.cpp set served for real (docs/instances.md): two llama-servers of this
machine, each run with the words the planner wrote for its instance, behind Debian's HAProxy
with the plan's own configuration. Chats through the balancer reach both instances (each one's
own /metrics counts its prompts); one killed, the other answers every request."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx

from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.plan.endpoint import EndpointDecisions
from epycd.plan.placement.ports import listening_ports
from epycd.render.balancer import haproxy_config
from tests.health.realvllm import free_port
from tests.llama.realllama import healthy, llama_server, tiny_gguf
from tests.plan.conftest import PlanWorkspace, fake_host
from tests.render.test_balancer import cached_haproxy, wait_until

READY_BOUND_S = 60


def _prompt_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("llamacpp:prompt_tokens_total"))
    return float(line.split()[-1])


def _chat(url: str) -> str:
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    )
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"])


def llama_members(decided: EndpointDecisions) -> list[LlamaServer]:
    """A llama.cpp set's servers."""
    members = list(decided.members)
    assert all(isinstance(m, LlamaServer) for m in members), decided.kind
    return [m for m in members if isinstance(m, LlamaServer)]


def planned_set(tmp_path: Path) -> EndpointDecisions:
    ws = PlanWorkspace(tmp_path)
    port = free_port()
    ws.endpoint(
        "tiny",
        f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\nmodel = "{tiny_gguf()}"\n'
        f"instances = 2\nport = {port}\nmax_model_len = 1024\n",
    )
    host: HostFacts = fake_host(tmp_path, "vm-zen5-24g", RuntimeFacts())
    result = ws.plan(host, listeners=listening_ports())["tiny"]
    assert result.plan is not None, [e.text for e in result.errors]
    decided = result.plan.decisions
    assert decided.kind == "llama-set", decided.kind
    return decided


def test_two_planned_llama_servers_behind_the_real_haproxy(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    decided = planned_set(tmp_path)
    urls = [f"http://127.0.0.1:{m.port}" for m in llama_members(decided)]
    servers = [
        subprocess.Popen(
            [str(llama_server()), *m.server_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for m in llama_members(decided)
    ]
    reap += servers
    binary, env = cached_haproxy()
    (tmp_path / "haproxy.cfg").write_text(haproxy_config(decided))
    balancer = subprocess.Popen(
        [str(binary), "-f", str(tmp_path / "haproxy.cfg")],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    reap.append(balancer)
    front = f"http://127.0.0.1:{decided.port}"
    assert wait_until(lambda: all(healthy(url) for url in urls), READY_BOUND_S), "not ready"
    assert wait_until(lambda: healthy(front), 30), "HAProxy did not pass /health on"
    for _ in range(6):
        _chat(front)
    counted = [_prompt_tokens(url) for url in urls]
    assert all(tokens > 0 for tokens in counted), f"prompt tokens per instance: {counted}"
    servers[1].kill()
    servers[1].wait()
    before = _prompt_tokens(urls[0])
    for _ in range(5):
        _chat(front)
    assert _prompt_tokens(urls[0]) > before
