"""The recipe's hand-off for a ready endpoint: its URL, a curl and a Python example, and
what it runs on, all from its approved plan. Pure."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import BaseModel, Field

from epycd.listen import DEFAULT_HOST, local_url
from epycd.plan.endpoint import EndpointDecisions, Plan

HANDOFF_MAX_TOKENS = 128


class Handoff(BaseModel):
    """The recipe's last step: everything a caller needs to use a ready endpoint."""

    base_url: str = Field(description="with the trailing /v1")
    served_model_name: str
    endpoint: str = Field(description="/v1/chat/completions or /v1/completions")
    why: str
    runtime: str
    port: int
    host: str = Field(default=DEFAULT_HOST, description="the address the endpoint listens on")
    api_key_file: str | None = Field(
        default=None, description="the file holding the API key clients send; never the key"
    )
    threads: int
    gpus: str = Field(default="", description="Instinct: the GPU indices, e.g. 0,1")
    kv_cache_gb: int | float | None  # whole GiB for vLLM, to 0.01 for llama.cpp
    max_model_len: int | None
    socket: int | None
    numa_nodes: list[int]
    cpus: str
    stop: str
    curl: str
    python: str


def base_url(port: int, host: str = DEFAULT_HOST) -> str:
    return f"{local_url(host, port)}/v1"


def primary_path(primary: str) -> str:
    return "/v1/chat/completions" if primary == "chat_completions" else "/v1/completions"


def ready_curl(url: str, served: str, primary: str, key_file: str | None = None) -> str:
    body: dict[str, Any] = {"model": served}
    if primary == "chat_completions":
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello, world"
    body |= {"max_tokens": HANDOFF_MAX_TOKENS, "temperature": 0.7}
    auth = f'-H "Authorization: Bearer $(cat {shlex.quote(key_file)})" ' if key_file else ""
    target = shlex.quote(url + primary_path(primary).removeprefix("/v1"))  # [::1] is a glob
    return (
        f"curl -s {target} {auth}"
        f"-H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"
    )


def openai_example(url: str, served: str, primary: str, key_file: str | None = None) -> str:
    if key_file:
        key = f"open({key_file!r}).read().strip()"
        head = f"from openai import OpenAI\n\nclient = OpenAI(base_url={url!r}, api_key={key})\n"
    else:
        head = (
            "from openai import OpenAI\n\n"
            f'client = OpenAI(base_url={url!r}, api_key="EMPTY")  # any non-empty key\n'
        )
    if primary == "chat_completions":
        call = (
            "r = client.chat.completions.create(\n"
            f"    model={served!r},\n"
            '    messages=[{"role": "user", "content": "Hello"}],\n'
            f"    max_tokens={HANDOFF_MAX_TOKENS}, temperature=0.7,\n"
            ")\n"
            "print(r.choices[0].message.content)\n"
        )
    else:
        call = (
            f'r = client.completions.create(model={served!r}, prompt="Hello, world", '
            f"max_tokens={HANDOFF_MAX_TOKENS})\n"
            "print(r.choices[0].text)\n"
        )
    return head + call


def cpu_count(cpus: str) -> int:
    from epycd.host.cpulist import parse_cpulist

    return len(parse_cpulist(cpus)) if cpus else 0


def omp_cpus(decisions: EndpointDecisions) -> str:
    """The CPUs vLLM's OpenMP threads run on; none are bound for an Instinct endpoint."""
    return decisions.omp_cpus


def handoff(plan: Plan) -> Handoff:
    """The hand-off of a ready endpoint, from its approved plan. Pure."""
    url = base_url(plan.decisions.port, plan.decisions.host)
    key_file = plan.decisions.api_key_file
    served, primary = (
        plan.decisions.served_model_name or plan.decisions.model,
        plan.decisions.primary_endpoint,
    )
    if primary == "chat_completions":
        why = "the model has a chat template: chat messages on /v1/chat/completions"
    else:
        why = "the model has no chat template: raw prompts on /v1/completions"
    return Handoff(
        base_url=url,
        served_model_name=served,
        endpoint=primary_path(primary),
        why=why,
        runtime=plan.decisions.runtime,
        port=plan.decisions.port,
        host=plan.decisions.host,
        api_key_file=key_file,
        threads=cpu_count(omp_cpus(plan.decisions)),
        gpus=",".join(map(str, plan.gpus)),
        kv_cache_gb=plan.decisions.kv_cache_gb,
        max_model_len=plan.decisions.max_model_len,
        socket=plan.decisions.socket,
        numa_nodes=list(plan.decisions.numa_nodes),
        cpus=plan.decisions.cpus,
        stop=f"epycctl stop {plan.endpoint}",
        curl=ready_curl(url, served, primary, key_file),
        python=openai_example(url, served, primary, key_file),
    )
