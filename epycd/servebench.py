"""The serving benchmark of a llama.cpp endpoint: what `epycctl bench` runs where there is no
vLLM, and so no `vllm bench serve`.

The same measure as vLLM's client: random prompts of `input_len` tokens (token ids drawn with a
fixed seed from the model's vocabulary, which the server reports, sent as the prompt itself so
no tokenizer is needed here), `output_len` tokens each (`ignore_eos`), streamed from the
OpenAI completions API, `concurrency` requests in flight until `prompts` are done. Tokens are
the server's own count: the `usage` of each response, never a count of the streamed chunks.
Output tok/s is the completion tokens over the wall time; TTFT is the first streamed text;
TPOT the rest of a request's time over its other tokens.

An embeddings or rerank endpoint (`measure_pooling`, either engine) generates nothing: each
request is random text of `input_len` words from a fixed list, as one embeddings input, or
for rerank a short query and `RERANK_DOCUMENTS` documents of that length. The measure is
requests/s, input tok/s (the server's `usage` again) and the latency's median and mean.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

SEED = 0
REQUEST_TIMEOUT_S = 600.0
RESENDS_UNANSWERED = 1


class BenchFailed(Exception):
    """A request the endpoint did not answer as asked: the message says which and why."""


@dataclass(frozen=True)
class Timing:
    """One request: seconds to the first text and to the end, the server's token counts."""

    ttft_s: float
    latency_s: float
    prompt_tokens: int
    completion_tokens: int

    @property
    def tpot_s(self) -> float | None:
        if self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


@dataclass(frozen=True)
class Measured:
    completed: int
    duration: float
    output_throughput: float
    mean_ttft_ms: float
    mean_tpot_ms: float | None
    prompt_tokens: int
    completion_tokens: int


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def vocabulary_size(base_url: str, key: str | None) -> int:
    """The model's vocabulary as llama-server reports it (`/v1/models`, its `meta.n_vocab`)."""
    reply = httpx.get(f"{base_url}/v1/models", headers=headers(key), timeout=30)
    reply.raise_for_status()
    try:
        return int(reply.json()["data"][0]["meta"]["n_vocab"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise BenchFailed(f"{base_url}/v1/models gives no vocabulary size (meta.n_vocab)") from None


def random_prompts(vocabulary: int, count: int, input_len: int) -> list[list[int]]:
    """`count` prompts of `input_len` token ids, the same for the same arguments."""
    draw = random.Random(SEED)
    return [[draw.randrange(vocabulary) for _ in range(input_len)] for _ in range(count)]


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], output_len: int
) -> Timing:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, reply = await _sent(client, client.build_request("POST", url, json=body))
    first: float | None = None
    usage: dict[str, int] | None = None
    try:
        if reply.status_code != 200:
            await reply.aread()
            raise BenchFailed(f"{url} answered {reply.status_code}: {reply.text[:300]}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    finally:
        await reply.aclose()
    ended = time.perf_counter()
    if usage is None:
        raise BenchFailed(f"{url} streamed no usage: the server's token count is the measure")
    return Timing(
        ttft_s=(first or ended) - started,
        latency_s=ended - started,
        prompt_tokens=int(usage["prompt_tokens"]),
        completion_tokens=int(usage["completion_tokens"]),
    )


async def _sent(client: httpx.AsyncClient, request: httpx.Request) -> tuple[float, httpx.Response]:
    """When the request went out and the streamed response. A kept-alive connection that the
    server closed as the request went out answers nothing (httpx: "Server disconnected without
    sending a response"): nothing was generated, so the request goes once more, on a new
    connection, and its time starts again."""
    for attempt in range(1 + RESENDS_UNANSWERED):
        started = time.perf_counter()
        try:
            return started, await client.send(request, stream=True)
        except httpx.RemoteProtocolError:
            if attempt == RESENDS_UNANSWERED:
                raise
    raise AssertionError("unreachable")


async def _run(
    base_url: str,
    model: str,
    key: str | None,
    prompts: list[list[int]],
    concurrency: int,
    output_len: int,
) -> tuple[list[Timing], float]:
    url = f"{base_url}/v1/completions"
    timings: list[Timing] = []

    async def send(client: httpx.AsyncClient, index: int) -> None:
        timings.append(await one_request(client, url, model, prompts[index], output_len))

    return timings, await _concurrently(len(prompts), concurrency, key, send)


def measure(
    base_url: str,
    model: str,
    key: str | None,
    *,
    concurrency: int,
    prompts: int,
    input_len: int,
    output_len: int,
    vocabulary: int | None = None,
) -> Measured:
    """One run at `concurrency`, after as many warm-up requests (not counted). The prompts'
    token ids are drawn from `vocabulary`, by default the server's own (its /v1/models)."""
    size = vocabulary if vocabulary is not None else vocabulary_size(base_url, key)
    chosen = random_prompts(size, prompts + concurrency, input_len)
    asyncio.run(_run(base_url, model, key, chosen[:concurrency], concurrency, output_len))
    timings, duration = asyncio.run(
        _run(base_url, model, key, chosen[concurrency:], concurrency, output_len)
    )
    completion = sum(t.completion_tokens for t in timings)
    tpots = [t.tpot_s for t in timings if t.tpot_s is not None]
    return Measured(
        completed=len(timings),
        duration=duration,
        output_throughput=completion / duration,
        mean_ttft_ms=1000 * sum(t.ttft_s for t in timings) / len(timings),
        mean_tpot_ms=1000 * sum(tpots) / len(tpots) if tpots else None,
        prompt_tokens=sum(t.prompt_tokens for t in timings),
        completion_tokens=completion,
    )


RERANK_DOCUMENTS = 4
RERANK_QUERY_WORDS = 8
COMMON_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea"
)
WORDS = tuple(COMMON_WORDS.split())
"""Common English words: one token each in most vocabularies, so `input_len` words are
about `input_len` tokens (the measure counts the server's own tokens, not these)."""


@dataclass(frozen=True)
class PoolingMeasured:
    completed: int
    duration: float
    request_throughput: float
    input_throughput: float
    p50_latency_ms: float
    mean_latency_ms: float
    prompt_tokens: int


def random_text(draw: random.Random, words: int) -> str:
    return " ".join(draw.choice(WORDS) for _ in range(words))


def pooling_bodies(
    endpoint: str, model: str, count: int, input_len: int
) -> list[dict[str, object]]:
    """`count` request bodies for `endpoint` ("embeddings" or "rerank"), the same for the same
    arguments."""
    draw = random.Random(SEED)
    if endpoint == "embeddings":
        return [{"model": model, "input": random_text(draw, input_len)} for _ in range(count)]
    return [
        {
            "model": model,
            "query": random_text(draw, RERANK_QUERY_WORDS),
            "documents": [random_text(draw, input_len) for _ in range(RERANK_DOCUMENTS)],
        }
        for _ in range(count)
    ]


async def one_pooling_request(
    client: httpx.AsyncClient, url: str, body: dict[str, object]
) -> tuple[float, int]:
    """(seconds to the whole answer, the server's count of the request's tokens)."""
    started, reply = await _sent(client, client.build_request("POST", url, json=body))
    try:
        await reply.aread()
    finally:
        await reply.aclose()
    ended = time.perf_counter()
    if reply.status_code != 200:
        raise BenchFailed(f"{url} answered {reply.status_code}: {reply.text[:300]}")
    usage = reply.json().get("usage") or {}
    tokens = usage.get("prompt_tokens") or usage.get("total_tokens")
    if not isinstance(tokens, int):
        raise BenchFailed(f"{url} gave no usage: the server's token count is the measure")
    return ended - started, tokens


async def _concurrently(
    count: int,
    concurrency: int,
    key: str | None,
    send: Callable[[httpx.AsyncClient, int], Awaitable[None]],
) -> float:
    """`send(client, i)` for each of `count` requests, `concurrency` at a time; the wall time."""
    queue = list(reversed(range(count)))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await send(client, queue.pop())

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        headers=headers(key), timeout=REQUEST_TIMEOUT_S, limits=limits
    ) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return time.perf_counter() - started


def measure_pooling(
    base_url: str,
    model: str,
    key: str | None,
    *,
    endpoint: str,
    concurrency: int,
    prompts: int,
    input_len: int,
) -> PoolingMeasured:
    """One run of `prompts` requests at `concurrency` on /v1/`endpoint`, after as many warm-up
    requests (not counted)."""
    url = f"{base_url}/v1/{endpoint}"
    bodies = pooling_bodies(endpoint, model, prompts + concurrency, input_len)
    answered: list[tuple[float, int]] = []

    def sender(offset: int, keep: bool) -> Callable[[httpx.AsyncClient, int], Awaitable[None]]:
        async def send(client: httpx.AsyncClient, index: int) -> None:
            result = await one_pooling_request(client, url, bodies[offset + index])
            if keep:
                answered.append(result)

        return send

    asyncio.run(_concurrently(concurrency, concurrency, key, sender(0, keep=False)))
    duration = asyncio.run(_concurrently(prompts, concurrency, key, sender(concurrency, keep=True)))
    latencies = [seconds for seconds, _ in answered]
    tokens = sum(count for _, count in answered)
    return PoolingMeasured(
        completed=len(answered),
        duration=duration,
        request_throughput=len(answered) / duration,
        input_throughput=tokens / duration,
        p50_latency_ms=1000 * statistics.median(latencies),
        mean_latency_ms=1000 * statistics.fmean(latencies),
        prompt_tokens=tokens,
    )
