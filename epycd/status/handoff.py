"""The recipe's hand-off for a ready endpoint: its URL, a curl and a Python example, and
what it runs on, all from its approved plan. Pure."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import BaseModel, Field

from epycd.health import PATHS
from epycd.listen import DEFAULT_HOST, local_url
from epycd.plan.endpoint import EndpointDecisions, Plan

HANDOFF_MAX_TOKENS = 128


class Handoff(BaseModel):
    """The recipe's last step: everything a caller needs to use a ready endpoint."""

    base_url: str = Field(description="with the trailing /v1")
    served_model_name: str
    endpoint: str = Field(
        description="its path: /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/rerank"
    )
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


WHY = {
    "chat_completions": "the model has a chat template: chat messages on /v1/chat/completions",
    "completions": "the model has no chat template: raw prompts on /v1/completions",
    "embeddings": "an embedding model: one vector per input on /v1/embeddings",
    "rerank": "a reranker: documents scored against a query on /v1/rerank",
}
RERANK_QUERY = "What is the capital of France?"
RERANK_DOCUMENTS = ["Paris is the capital of France.", "Berlin is the capital of Germany."]
EMBEDDING_INPUTS = ["Hello, world", "Goodbye, world"]


def primary_path(primary: str) -> str:
    return PATHS[primary] if primary in PATHS else PATHS["completions"]


def request_body(served: str, primary: str) -> dict[str, Any]:
    """What the hand-off's examples send to the endpoint's own path."""
    if primary == "embeddings":
        return {"model": served, "input": EMBEDDING_INPUTS}
    if primary == "rerank":
        return {"model": served, "query": RERANK_QUERY, "documents": RERANK_DOCUMENTS}
    body: dict[str, Any] = {"model": served}
    if primary == "chat_completions":
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello, world"
    return body | {"max_tokens": HANDOFF_MAX_TOKENS, "temperature": 0.7}


def ready_curl(url: str, served: str, primary: str, key_file: str | None = None) -> str:
    body = request_body(served, primary)
    auth = f'-H "Authorization: Bearer $(cat {shlex.quote(key_file)})" ' if key_file else ""
    target = shlex.quote(url + primary_path(primary).removeprefix("/v1"))  # [::1] is a glob
    return (
        f"curl -s {target} {auth}"
        f"-H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"
    )


def openai_example(url: str, served: str, primary: str, key_file: str | None = None) -> str:
    """The OpenAI client's call for the endpoint's path; for rerank, which the OpenAI API
    lacks, httpx (the OpenAI client's own HTTP library) posts the same body as the curl."""
    key = f"open({key_file!r}).read().strip()" if key_file else None
    if primary == "rerank":
        auth = f'headers={{"Authorization": "Bearer " + {key}}}, ' if key else ""
        return (
            "import httpx\n\n"
            f"r = httpx.post({url + '/rerank'!r}, {auth}json={{\n"
            f'    "model": {served!r},\n'
            f'    "query": {RERANK_QUERY!r},\n'
            f'    "documents": {RERANK_DOCUMENTS!r},\n'
            "})\n"
            'for result in r.json()["results"]:\n'
            '    print(result["index"], result["relevance_score"])\n'
        )
    if key:
        head = f"from openai import OpenAI\n\nclient = OpenAI(base_url={url!r}, api_key={key})\n"
    else:
        head = (
            "from openai import OpenAI\n\n"
            f'client = OpenAI(base_url={url!r}, api_key="EMPTY")  # any non-empty key\n'
        )
    if primary == "embeddings":
        call = (
            f"r = client.embeddings.create(model={served!r}, input={EMBEDDING_INPUTS!r})\n"
            "print(len(r.data), len(r.data[0].embedding))\n"
        )
    elif primary == "chat_completions":
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
    why = WHY.get(primary, WHY["completions"])
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
