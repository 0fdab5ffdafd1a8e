"""`epycctl bench NAME`: measure the ready endpoint serving, by its engine's own bench client
(`BENCH` in its package's `cli.py`: vLLM's runs `vllm bench serve`, and `--offline` its
`vllm bench throughput`, `epycd.engines.vllm.cli.bench`), or for an engine without one
(llama.cpp) by epycd's own client of the same measure (`epycd.servebench`: the server's own
token counts). Random prompts, fixed seed, one run per concurrency; the results (output
tok/s, TTFT, TPOT) are kept in `STATE_DIR/bench/NAME.json`. An embeddings or rerank endpoint,
of either engine, is measured by epycd's pooling client (`epycd.servebench.measure_pooling`):
requests/s, input tok/s and latency.

The client calls the endpoint as any client on this machine does: at its own address
(`epycd.listen.local_url`: the endpoint file's `host`, IPv6 in brackets, loopback for a
wildcard), with its API key when it has one. The key is read from the root-only
api_key_file (as the plan reads it) into the bench process's environment only
(OPENAI_API_KEY, where vLLM's client reads it): never its argv, a log or another file.

Only root or the admin group may run it (as `approve`): the result is kept in the state
folder, and the key file and the offline run's pinning are root's.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import BaseModel, Field

from epycd.cli.bench_runs import METRICS, Alternative, BenchRun, Measure, pooling_measure, runs_at
from epycd.cli.output import json_option, print_json, table
from epycd.errors import InputError, Refusal
from epycd.listen import local_url
from epycd.model.facts import POOLING_ENDPOINTS
from epycd.settings import Settings, load_settings

if TYPE_CHECKING:
    from epycd.plan.endpoint import Plan

API_KEY_ENV = "OPENAI_API_KEY"
"""Where vLLM's bench client (`vllm bench serve`, OpenAI backends) reads the API key."""
PROGRESS_INTERVAL_S = 1.0
BENCH_TIMEOUT_S = 3600
DEFAULT_CONCURRENCIES = (1, 8, 32)


class BenchResult(BaseModel):
    endpoint: str
    measured_at: datetime
    input_len: int
    output_len: int
    runs: list[BenchRun]
    mode: str = Field(default="serve", description='"serve" or "offline" (bench throughput)')
    alternatives: list[Alternative] = Field(
        default_factory=list,
        description="`--compare`: the plain servers measured beside it; left out when none",
        exclude_if=lambda alternatives: not alternatives,
    )


def bench_path(settings: Settings, name: str) -> Path:
    return settings.state_dir / "bench" / f"{name}.json"


def answers(plan: Plan) -> bool:
    import httpx

    try:
        return httpx.get(health_url(plan), timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def health_url(plan: Plan) -> str:
    return f"{local_url(plan.decisions.host, plan.decisions.port)}/health"


def api_key(plan: Plan) -> str | None:
    """The endpoint's API key from its root-only api_key_file, read by the plan's own secret
    reader; None for an endpoint without one."""
    if not plan.decisions.api_key_file:
        return None
    from epycd.plan.service.secrets import read_api_key

    return read_api_key(Path(plan.decisions.api_key_file), Path(plan.decisions.config_file))


def bench_env(key: str | None) -> dict[str, str]:
    """The bench client's environment: this one with the endpoint's key as OPENAI_API_KEY,
    or without any OPENAI_API_KEY (the caller's key for another service is not sent)."""
    env = {name: value for name, value in os.environ.items() if name != API_KEY_ENV}
    return env | {API_KEY_ENV: key} if key else env


def require_ready(plan: Plan, name: str) -> None:
    if not answers(plan):
        raise Refusal(
            f"{name} is not ready: {health_url(plan)} does not answer 200",
            fix=f"epycctl start {name}; `epycctl status {name}` says when it is ready",
        )


@click.command("bench")
@click.argument("name")
@click.option(
    "--concurrency",
    "concurrencies",
    type=click.IntRange(min=1),
    multiple=True,
    help="concurrent requests; repeat for several runs (default 1, 8, 32)",
)
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True)
@click.option(
    "--prompts-per-concurrency",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="prompts per run = this x concurrency (at least 8)",
)
@click.option(
    "--offline",
    is_flag=True,
    help="`vllm bench throughput` with the endpoint's sizing, the endpoint stopped",
)
@click.option(
    "--compare",
    is_flag=True,
    help="then the same load on each engine's plain defaults on this host, one at a time",
)
@json_option("print the result as JSON")
def bench(
    name: str,
    concurrencies: tuple[int, ...],
    input_len: int,
    output_len: int,
    prompts_per_concurrency: int,
    offline: bool,
    compare: bool,
    as_json: bool,
) -> None:
    """Measure NAME's ready endpoint serving (tok/s, TTFT, TPOT): `vllm bench serve`, or for a
    llama.cpp endpoint epycd's own client of the same measure; `--compare` measures the
    plain servers an admin would otherwise run beside it."""
    from epycd.approval.permissions import require_admin

    if compare and offline:
        raise InputError(
            "--compare measures plain servers beside the running endpoint; --offline stops it",
            key="--compare",
            fix=f"epycctl bench {name} --compare (without --offline)",
        )
    settings = load_settings()
    require_admin(settings, "bench --offline" if offline else "bench")
    plan = approved_plan(settings, name)
    client = bench_client(plan.decisions.engine, plan.decisions.primary_endpoint)
    lengths = (input_len, output_len)
    wanted = concurrencies or DEFAULT_CONCURRENCIES
    if offline:
        refuse_without_offline_bench(plan, client)
        runs = [client.offline_run(plan, name, prompts_per_concurrency, lengths)]
    else:
        require_ready(plan, name)
        runs = client.serve_runs(plan, wanted, prompts_per_concurrency, lengths)
    alternatives = []
    if compare:
        from epycd.cli.bench_compare import Load, compare_alternatives

        load = Load(wanted, prompts_per_concurrency, lengths, plan.decisions.primary_endpoint)
        alternatives = compare_alternatives(plan, settings, load, api_key(plan))
    result = BenchResult(
        endpoint=name,
        measured_at=datetime.now(UTC),
        input_len=input_len,
        output_len=output_len,
        runs=runs,
        mode="offline" if offline else "serve",
        alternatives=alternatives,
    )
    finish(settings, result, as_json)


class BenchClient:
    """How `epycctl bench` measures an engine's endpoint. This one is epycd's own client of the
    OpenAI API, for an engine without a client of its own; an engine that has one defines
    `BENCH` in its package's `cli.py` (vLLM: `vllm bench serve`, and `--offline`)."""

    offline: bool = False
    """Whether it has an offline mode (`--offline`: the endpoint stopped, its sizing)."""

    def serve_runs(
        self,
        plan: Plan,
        concurrencies: tuple[int, ...],
        prompts_per_concurrency: int,
        lengths: tuple[int, int],
    ) -> list[BenchRun]:
        return openai_client_runs(plan, concurrencies, prompts_per_concurrency, lengths)

    def offline_run(
        self, plan: Plan, name: str, prompts_per_concurrency: int, lengths: tuple[int, int]
    ) -> BenchRun:
        raise Refusal(f"{name}: its engine has no offline bench", fix=f"epycctl bench {name}")


class PoolingBenchClient(BenchClient):
    """An embeddings or rerank endpoint, of either engine: epycd's own client of its path
    (`epycd.servebench.measure_pooling`): requests/s, input tok/s and latency. No offline
    mode: vLLM's `bench throughput` generates."""

    def serve_runs(
        self,
        plan: Plan,
        concurrencies: tuple[int, ...],
        prompts_per_concurrency: int,
        lengths: tuple[int, int],
    ) -> list[BenchRun]:
        return pooling_runs(plan, concurrencies, prompts_per_concurrency, lengths[0])


OPENAI_CLIENT = BenchClient()
POOLING_CLIENT = PoolingBenchClient()


def bench_client(engine: str, primary_endpoint: str = "chat_completions") -> BenchClient:
    """epycd's pooling client for an embeddings or rerank endpoint; else the engine's own
    bench client, else epycd's client of the OpenAI API."""
    from epycd import engines

    if primary_endpoint in POOLING_ENDPOINTS:
        return POOLING_CLIENT
    return engines.engine_named(engine).implementation("cli", "BENCH", BenchClient, OPENAI_CLIENT)


def refuse_without_offline_bench(plan: Plan, client: BenchClient) -> None:
    """--offline is an engine's own offline mode (vLLM's `bench throughput`): an endpoint of
    an engine without one is refused."""
    from epycd.engines import engine_named

    if not client.offline and plan.decisions.pooling:
        raise Refusal(
            f"{plan.endpoint} serves /v1/{plan.decisions.primary_endpoint}: --offline is "
            "vLLM's `bench throughput`, which measures generated tokens",
            fix=f"epycctl bench {plan.endpoint} (without --offline) measures it serving",
        )
    if not client.offline:
        title = engine_named(plan.decisions.engine).title
        raise Refusal(
            f"{plan.endpoint} is served by {title}: --offline is vLLM's `bench throughput`, "
            f"which a {title} endpoint does not have",
            fix=f"epycctl bench {plan.endpoint} (without --offline) measures it serving",
        )


def openai_client_runs(
    plan: Plan,
    concurrencies: tuple[int, ...],
    prompts_per_concurrency: int,
    lengths: tuple[int, int],
) -> list[BenchRun]:
    """An engine without a bench client of its own (llama-server has no vLLM): epycd's own
    client of the OpenAI API (`epycd.servebench`), one run per concurrency, the same measure
    and the same prompt counts as `vllm bench serve`."""
    from epycd.servebench import measure

    def one(base: str, key: str | None, concurrency: int, prompts: int) -> dict[str, Any]:
        measured = measure(
            base, plan.decisions.served_model_name, key, concurrency=concurrency,
            prompts=prompts, input_len=lengths[0], output_len=lengths[1],
        )  # fmt: skip
        return {name: getattr(measured, name) for name in METRICS}

    return client_runs(plan, concurrencies, prompts_per_concurrency, one)


def pooling_runs(
    plan: Plan, concurrencies: tuple[int, ...], prompts_per_concurrency: int, input_len: int
) -> list[BenchRun]:
    """`epycd.servebench.measure_pooling` on the endpoint's own path, one run per
    concurrency, as many prompts as the generating runs."""
    decided = plan.decisions
    one = pooling_measure(decided.served_model_name, decided.primary_endpoint, input_len)
    return client_runs(plan, concurrencies, prompts_per_concurrency, one)


def client_runs(
    plan: Plan, concurrencies: tuple[int, ...], prompts_per_concurrency: int, one: Measure
) -> list[BenchRun]:
    """`one` run per concurrency against the endpoint at its own address, with its key; a run
    the endpoint fails is kept with its error (the key never in it) and the next one runs."""
    base = local_url(plan.decisions.host, plan.decisions.port)
    return runs_at(base, api_key(plan), concurrencies, prompts_per_concurrency, one)


def approved_plan(settings: Settings, name: str) -> Plan:
    from epycd.approval.record import load_approval

    approval = load_approval(settings, name)
    if approval is None:
        raise InputError(
            f"{name} is not approved", fix=f"epycctl plan {name}; epycctl approve {name}"
        )
    return approval.plan


def finish(settings: Settings, result: BenchResult, as_json: bool) -> None:
    """Keep the result for `status NAME`, show it; exit 1 when a run failed."""
    from epycd.atomic import write_atomic

    write_atomic(bench_path(settings, result.endpoint), result.model_dump_json(indent=1).encode())
    show(result, as_json)
    if any(run.error for run in result.runs):
        raise SystemExit(1)


def show(result: BenchResult, as_json: bool) -> None:
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    click.echo(bench_table(result))
    sys.stdout.flush()


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def bench_table(result: BenchResult) -> str:
    """Output tok/s, TTFT and TPOT per concurrency (`bench`, and `status NAME`'s last one);
    requests/s, input tok/s and latency for an embeddings or rerank endpoint. With
    `--compare`'s alternatives, a first column says which server each row measured, the
    endpoint's rows first; a skipped alternative is a line below with its reason."""
    pooled = any(run.request_throughput is not None for run in result.runs)
    header = POOLING_COLUMNS if pooled else COLUMNS
    if not result.alternatives:
        return table(run_rows(result.runs, pooled), header=header)
    rows = [(result.endpoint, *row) for row in run_rows(result.runs, pooled)]
    for alternative in result.alternatives:
        rows += [(alternative.label, *row) for row in run_rows(alternative.runs, pooled)]
    skipped = [
        f"{alternative.label}: skipped: {alternative.skipped}"
        for alternative in result.alternatives
        if alternative.skipped
    ]
    return "\n".join([table(rows, header=("Server", *header)), *skipped])


COLUMNS = ("Concurrency", "Output tok/s", "TTFT ms", "TPOT ms", "Error")
POOLING_COLUMNS = ("Concurrency", "Requests/s", "Input tok/s", "p50 ms", "Mean ms", "Error")


def run_rows(runs: list[BenchRun], pooled: bool) -> list[tuple[object, ...]]:
    if pooled:
        return [
            (
                run.concurrency,
                _number(run.request_throughput, 1),
                _number(run.input_throughput, 0),
                _number(run.p50_latency_ms, 1),
                _number(run.mean_latency_ms, 1),
                run.error or "",
            )
            for run in runs
        ]
    return [
        (
            run.concurrency,
            _number(run.output_throughput, 1),
            _number(run.mean_ttft_ms, 0),
            _number(run.mean_tpot_ms, 1),
            run.error or "",
        )
        for run in runs
    ]
