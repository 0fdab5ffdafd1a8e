"""What `epycctl bench` measures, a run at one concurrency (`BenchRun`) and an alternative
of `--compare` (`Alternative`), and epycd's own client's loop over the concurrencies at a
server's address (`runs_at`), shared by the endpoint's runs and the alternatives'."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click
from pydantic import BaseModel, Field

METRICS = ("completed", "duration", "output_throughput", "mean_ttft_ms", "mean_tpot_ms")
POOLING_METRICS = (
    "completed",
    "duration",
    "request_throughput",
    "input_throughput",
    "p50_latency_ms",
    "mean_latency_ms",
)


class BenchRun(BaseModel):
    concurrency: int
    num_prompts: int
    output_throughput: float | None = Field(default=None, description="output tokens/s")
    mean_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    completed: int | None = None
    duration: float | None = None
    request_throughput: float | None = Field(
        default=None, description="requests/s (an embeddings or rerank endpoint's measure)"
    )
    input_throughput: float | None = Field(default=None, description="input tokens/s (the same)")
    p50_latency_ms: float | None = None
    mean_latency_ms: float | None = None
    error: str | None = None


class Alternative(BaseModel):
    """`--compare`: what an admin would otherwise run on this host (an engine's plain
    defaults), measured by the same load as the endpoint, or why it was not."""

    label: str
    argv: list[str] | None = Field(default=None, description="the command as it was run")
    cpus: str | None = Field(default=None, description="the CPUs it was pinned to")
    runs: list[BenchRun] = Field(default_factory=list)
    skipped: str | None = Field(default=None, description="why it was not measured")


Measure = Callable[[str, "str | None", int, int], dict[str, Any]]
"""One run of a client of epycd's: (base URL, key, concurrency, requests) -> BenchRun's
figures."""


def runs_at(
    base: str,
    key: str | None,
    concurrencies: tuple[int, ...],
    prompts_per_concurrency: int,
    one: Measure,
) -> list[BenchRun]:
    """`one` run per concurrency against the server at `base`; a failed run is kept with its
    error (the key never in it) and the next one runs."""
    import httpx

    from epycd.servebench import BenchFailed

    runs = []
    for concurrency in concurrencies:
        prompts = max(8, prompts_per_concurrency * concurrency)
        label = f"concurrency {concurrency}"
        click.echo(f"{label}: running", err=True)
        started = time.monotonic()
        try:
            values = one(base, key, concurrency, prompts)
        except (BenchFailed, httpx.HTTPError) as error:
            text = f"{type(error).__name__}: {error}"
            text = text.replace(key, "<api key>") if key else text
            runs.append(BenchRun(concurrency=concurrency, num_prompts=prompts, error=text))
            continue
        click.echo(f"{label}: done in {time.monotonic() - started:.0f} s", err=True)
        runs.append(BenchRun(concurrency=concurrency, num_prompts=prompts, **values))
    return runs


def pooling_measure(model: str, endpoint: str, input_len: int) -> Measure:
    """One run of epycd's pooling client (`epycd.servebench.measure_pooling`) on /v1/`endpoint`
    of the server at the base URL: an embeddings or rerank endpoint's, or its alternative's."""

    def one(base: str, key: str | None, concurrency: int, prompts: int) -> dict[str, Any]:
        from epycd.servebench import measure_pooling

        measured = measure_pooling(base, model, key, endpoint=endpoint, concurrency=concurrency,
                                   prompts=prompts, input_len=input_len)  # fmt: skip
        return {name: getattr(measured, name) for name in POOLING_METRICS}

    return one
