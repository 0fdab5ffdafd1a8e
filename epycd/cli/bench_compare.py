"""`epycctl bench NAME --compare`: after the endpoint's own runs, the same load against what
an admin would otherwise run on this host: the endpoint's engine with its plain defaults,
then each other engine as the planner would run it (the endpoint's own file planned with
that engine: `planned_with`) and with its plain defaults, where it can serve the model.
Each engine says what those are (`PlainServer`, `PLAIN` in its package's `cli.py`): the
argv, or why not.

Each alternative is a child process on a free loopback port, pinned to its plan's CPUs (a
plain one: the endpoint's own), waited for until its /health answers 200 (bounded),
measured by epycd's OpenAI client (`epycd.servebench`: every alternative is an OpenAI
server without a key), then stopped (its process group: SIGTERM, SIGKILL after a bound),
also on an error, Ctrl-C or SIGTERM.
One at a time; the endpoint keeps running, idle. An alternative that cannot run is kept as
skipped with its reason; none fails the command."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

import click
import httpx

from epycd.cli.bench_runs import METRICS, Alternative, BenchRun, pooling_measure, runs_at
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.listen import local_url
from epycd.model.facts import POOLING_ENDPOINTS
from epycd.settings import Settings

if TYPE_CHECKING:
    from epycd.engines import Engine
    from epycd.host.facts import HostFacts
    from epycd.plan.endpoint import Plan

LOOPBACK = "127.0.0.1"
STOP_BOUND_S = 30.0
POLL_S = 0.5
LOG_TAIL_LINES = 3
SAFE_VOCABULARY = 1000
"""Token ids every tokenizer holds: the prompts' ids where neither the endpoint nor the
alternative reports its vocabulary (vLLM's /v1/models gives none)."""
KEY_VARIABLES = ("OPENAI_API_KEY", "LLAMA_API_KEY", "VLLM_API_KEY")


@dataclass(frozen=True)
class Load:
    """What the endpoint was measured with, run again on each alternative."""

    concurrencies: tuple[int, ...]
    prompts_per_concurrency: int
    lengths: tuple[int, int]
    endpoint: str = "chat_completions"
    """The endpoint's path (`primary_endpoint`): an embeddings or rerank endpoint's load is
    epycd's pooling client's (`measure_pooling`, inputs of the input length)."""


@dataclass(frozen=True)
class PlainCommand:
    """One alternative: the argv to run on `port` (and what its environment must add to find
    the model, such as the endpoint's HF cache), or why it cannot run here; `cpus`, the CPUs
    its plan pins it to, where that is not the endpoint's own."""

    label: str
    port: int = 0
    argv: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None
    start_bound_s: float = 120.0
    cpus: str | None = None


class PlainServer:
    """An engine's plain defaults on this host (`PLAIN` in its package's `cli.py`): `own`
    serves the endpoint's model as its engine's plain command would, `other` serves the model
    of an endpoint of another engine. This one, for an engine without (`NoPlain`): skipped."""

    label = "plain server"

    def own(self, plan: Plan, settings: Settings, port: int) -> PlainCommand:
        return self.skip("its engine has no plain server to compare")

    def other(self, plan: Plan, settings: Settings, port: int) -> PlainCommand:
        return self.skip("its engine has no plain server to compare")

    def planned(self, plan: Plan, port: int) -> PlainCommand:
        """The server `plan` (the endpoint's file planned with this engine) runs, on `port`
        of the loopback, with the plan's environment and CPUs; its label is the caller's."""
        return self.skip("its engine has no planned server to compare")

    def skip(self, reason: str) -> PlainCommand:
        return PlainCommand(label=self.label, skipped=reason)


NO_PLAIN = PlainServer()


class NoPlain(PlainServer):
    """An engine without `PLAIN`: skipped, under its own name."""

    def __init__(self, title: str) -> None:
        self.label = f"{title}, plain defaults"


PlainMaker = Callable[["Plan", Settings, int], PlainCommand]


def plain_server(engine: Engine) -> PlainServer:
    found = engine.implementation("cli", "PLAIN", PlainServer, NO_PLAIN)
    return NoPlain(engine.title) if found is NO_PLAIN else found


def plain_makers(plan: Plan, host: HostFacts | None = None) -> list[PlainMaker]:
    """The endpoint's engine's plain defaults first, then each other engine planned and with
    its plain defaults. `host`: the facts to plan on, else this host's."""
    from epycd import engines

    own = plan.decisions.engine
    others: list[PlainMaker] = []
    for engine in engines.ENGINES:
        if engine.name != own:
            others += [planned_maker(engine, host), plain_server(engine).other]
    return [plain_server(engines.engine_named(own)).own, *others]


def planned_maker(engine: Engine, host: HostFacts | None) -> PlainMaker:
    """`engine`'s planned server for the endpoint, or why there is none."""
    label = f"{engine.title}, planned"

    def make(plan: Plan, settings: Settings, port: int) -> PlainCommand:
        swapped = planned_with(plan, settings, engine.name, host)
        if isinstance(swapped, str):
            return PlainCommand(label=label, skipped=swapped)
        return dataclasses.replace(plain_server(engine).planned(swapped, port), label=label)

    return make


def planned_with(
    plan: Plan, settings: Settings, engine: str, host: HostFacts | None = None
) -> Plan | str:
    """The endpoint's own file planned with `engine = ENGINE` (as `engine = "auto"` tries
    each engine), on this host (or `host`), the approved endpoints holding their CPUs and
    ports, its own among them; else why it cannot be."""
    from epycd.approval.record import approved_plans
    from epycd.plan.pipeline.current import plan_endpoints
    from epycd.render import render_for_plan
    from epycd.spec import load_endpoint
    from epycd.stack import shipped_stack

    asked = f'its file planned with engine = "{engine}"'
    found = load_endpoint(Path(plan.decisions.config_file), precisions=shipped_stack().precisions)
    if found.spec is None or found.errors:
        return f"{asked}: " + "; ".join(str(error) for error in found.errors)
    as_engine = dataclasses.replace(found, spec=found.spec.model_copy(update={"engine": engine}))
    planned = plan_endpoints(
        settings, approved_plans(settings), render=render_for_plan, specs=[as_engine], host=host
    )
    [result] = planned.results
    if result.prerequisite is not None:
        made = result.prerequisite
        return (
            f"{asked}: {result.errors[0].message}; to measure it, make it first: epycctl "
            f"{made.action} {made.model} --quantize {made.quantize} --output {made.output}"
        )
    if result.plan is None:
        return f"{asked}: " + "; ".join(problem.text for problem in result.errors)
    servers = len(result.plan.decisions.servers)
    if servers > 1:
        return f"{asked}: {servers} instances behind a balancer; --compare runs one server"
    return result.plan


def compare_alternatives(
    plan: Plan, settings: Settings, load: Load, key: str | None
) -> list[Alternative]:
    """Each alternative, one at a time, measured or skipped with its reason; `key` is the
    endpoint's, to read the vocabulary it reports (the alternatives get none)."""
    makers = plain_makers(plan)
    endpoint = local_url(plan.decisions.host, plan.decisions.port)
    vocabulary = reported_vocabulary(endpoint, key)
    alternatives = []
    with sigterm_raises():
        for make in makers:
            command = make(plan, settings, free_port())
            cpus, problem = pinned_cpus(command.cpus or plan.decisions.cpus)
            if command.skipped is None and problem is not None:
                command = PlainCommand(label=command.label, argv=command.argv, skipped=problem)
            alternatives.append(run_alternative(command, cpus, vocabulary, load))
    return alternatives


def pinned_cpus(planned_cpus: str) -> tuple[set[int], str | None]:
    """The planned CPUs (the endpoint's, or an alternative's own plan's) this process may
    run on: where the alternative is pinned."""
    cpus = set(parse_cpulist(planned_cpus)) & os.sched_getaffinity(0)
    if cpus:
        return cpus, None
    allowed = format_cpulist(sorted(os.sched_getaffinity(0)))
    return cpus, f"none of the planned CPUs ({planned_cpus}) is one it may run on ({allowed})"


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM ends the command as Ctrl-C does, through the `finally` that stops a child."""

    def raise_exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_alternative(
    command: PlainCommand, cpus: set[int], vocabulary: int | None, load: Load
) -> Alternative:
    if command.skipped is not None or command.argv is None:
        return Alternative(label=command.label, skipped=command.skipped or "nothing to run")
    done = Alternative(label=command.label, argv=command.argv, cpus=format_cpulist(sorted(cpus)))
    click.echo(f"{command.label}: starting on CPUs {done.cpus}", err=True)
    base = f"http://{LOOPBACK}:{command.port}"
    with tempfile.TemporaryFile() as log:
        try:
            child = start(command, cpus, log)
        except OSError as error:
            return done.model_copy(update={"skipped": f"could not start: {error}"})
        try:
            problem = wait_ready(child, base, command.start_bound_s, log)
            if problem is not None:
                return done.model_copy(update={"skipped": problem})
            return done.model_copy(update={"runs": measure_at(base, vocabulary, load)})
        finally:
            stop(child)
            click.echo(f"{command.label}: stopped", err=True)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without any API key (a plain server listens without one), with what
    the command adds."""
    return {k: v for k, v in os.environ.items() if k not in KEY_VARIABLES} | extra


def start(command: PlainCommand, cpus: set[int], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """The child in a process group of its own (stopped whole; Ctrl-C reaches this command
    only), pinned before it runs, so every thread it makes is."""
    assert command.argv is not None
    return subprocess.Popen(
        command.argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(command.env),
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )


def wait_ready(
    child: subprocess.Popen[bytes], base: str, bound_s: float, log: IO[bytes]
) -> str | None:
    """None once /health answers 200; else why not (it ended, or the bound passed)."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if child.poll() is not None:
            return f"ended with exit {child.returncode} before it was ready: {tail(log)}"
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                click.echo(f"ready in {time.monotonic() - started:.0f} s", err=True)
                return None
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    return f"/health did not answer 200 within {bound_s:.0f} s: {tail(log)}"


def tail(log: IO[bytes]) -> str:
    log.seek(0)
    lines = log.read().decode(errors="replace").strip().splitlines()
    return " / ".join(lines[-LOG_TAIL_LINES:]) or "no output"


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its process group, SIGKILL after `STOP_BOUND_S`; reaped either way."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            child.wait()
            return
        try:
            child.wait(STOP_BOUND_S)
            kill_group_rest(child.pid)
            return
        except subprocess.TimeoutExpired:
            continue
    child.wait()


def kill_group_rest(group: int) -> None:
    """What the leader left in its group (vLLM's engine core, a worker) goes too."""
    with suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def served_model(base: str) -> str:
    """The id a plain server answers to: its /v1/models' first (a file's or a model's name)."""
    reply = httpx.get(f"{base}/v1/models", timeout=30)
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])


def reported_vocabulary(base: str, key: str | None) -> int | None:
    """The vocabulary a server reports (llama-server's /v1/models), else None."""
    from epycd.servebench import BenchFailed, vocabulary_size

    try:
        return vocabulary_size(base, key)
    except (BenchFailed, httpx.HTTPError):
        return None


def measure_at(base: str, vocabulary: int | None, load: Load) -> list[BenchRun]:
    """The endpoint's load on the alternative: the endpoint's vocabulary where it reports
    one (the same prompts), else the alternative's own, else `SAFE_VOCABULARY`; an embeddings
    or rerank endpoint's, by the pooling client on the same path."""
    from epycd.servebench import measure

    try:
        model = served_model(base)
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as error:
        failed = f"{base}/v1/models: {type(error).__name__}: {error}"
        return [BenchRun(concurrency=c, num_prompts=0, error=failed) for c in load.concurrencies]
    if load.endpoint in POOLING_ENDPOINTS:
        return pooling_at(base, model, load)
    size = vocabulary or reported_vocabulary(base, None) or SAFE_VOCABULARY
    input_len, output_len = load.lengths

    def one(url: str, key: str | None, concurrency: int, prompts: int) -> dict[str, Any]:
        measured = measure(url, model, key, concurrency=concurrency, prompts=prompts,
                           input_len=input_len, output_len=output_len, vocabulary=size)  # fmt: skip
        return {name: getattr(measured, name) for name in METRICS}

    return runs_at(base, None, load.concurrencies, load.prompts_per_concurrency, one)


def pooling_at(base: str, model: str, load: Load) -> list[BenchRun]:
    """The pooling client on the alternative's `load.endpoint`, as `bench` measures an
    embeddings or rerank endpoint."""
    one = pooling_measure(model, load.endpoint, load.lengths[0])
    return runs_at(base, None, load.concurrencies, load.prompts_per_concurrency, one)
