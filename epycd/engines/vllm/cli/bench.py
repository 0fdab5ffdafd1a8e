"""vLLM's bench client's commands (`BENCH` in this package): `vllm bench serve` of the
endpoint's own vLLM (the host venv's, or the image's on the host network, the HF cache and
model folders mounted as the unit mounts them), one run per concurrency (`serve_runs`); and
`--offline`, `vllm bench throughput` with the endpoint's own sizing, pinned as its unit pins
it, the endpoint stopped (`offline_run`). The key reaches `vllm bench serve` in its
environment only (`epycd.cli.bench.bench_env`), never its argv."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from epycd.cli.bench import (
    API_KEY_ENV,
    BENCH_TIMEOUT_S,
    PROGRESS_INTERVAL_S,
    answers,
    api_key,
    bench_env,
)
from epycd.cli.bench_runs import METRICS, BenchRun
from epycd.engines.vllm.plan.model import AnyVllmServer
from epycd.errors import Refusal
from epycd.listen import local_url
from epycd.plan.endpoint import Plan
from epycd.readfile import TOOL_OUTPUT_MAX_BYTES, read_json_object

RESULT_IN_CONTAINER = "/epycd-bench"
RESULT_FIX = "run the benchmark again; vllm bench of the endpoint's vLLM writes this file"


def serve_bench_args(
    plan: Plan, concurrency: int, prompts: int, lengths: tuple[int, int], out: str
) -> list[str]:
    """`vllm bench serve` arguments against the endpoint, the result written to `out`."""
    base = local_url(plan.decisions.host, plan.decisions.port)
    folder, _, file_name = out.rpartition("/")
    return [
        "bench", "serve", "--backend", "vllm", "--base-url", base,
        "--model", plan.decisions.served_model_name, "--tokenizer", plan.decisions.model,
        "--dataset-name", "random",
        "--random-input-len", str(lengths[0]), "--random-output-len", str(lengths[1]),
        "--ignore-eos", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--seed", "0", "--disable-tqdm",
        "--save-result", "--result-dir", folder, "--result-filename", file_name,
    ]  # fmt: skip


def bench_argv(plan: Plan, args: list[str], results: Path) -> list[str]:
    """The endpoint's own vLLM: the host venv, or the image on the host network."""
    from epycd.engines.vllm.plan.model import VllmService

    decisions = plan.decisions.first
    assert isinstance(decisions, VllmService), "vLLM's client only"
    if decisions.runtime == "host":
        return [str(decisions.vllm_executable), *args]
    mounts = [f"{results}:{RESULT_IN_CONTAINER}"]
    if decisions.hf_cache:
        mounts.append(f"{decisions.hf_cache.host_path}:{decisions.hf_cache.container_path}")
    mounts += [f"{m.host_path}:{m.container_path}:ro" for m in decisions.extra_mounts]
    argv = [plan.decisions.runtime, "run", "--rm", "--network=host", "--entrypoint", "vllm"]
    if plan.decisions.api_key_file and args[:2] == ["bench", "serve"]:
        argv.append(f"--env={API_KEY_ENV}")  # the name only: the value from bench_env
    for mount in mounts:
        argv += ["-v", mount]
    return [*argv, str(plan.decisions.image), *args]


def offline_target(plan: Plan) -> AnyVllmServer:
    """The vLLM process the offline benchmark runs as: the endpoint's own, or a set's first
    instance (every member is sized alike; its own CPUs, nodes and environment)."""
    from epycd.engines.vllm.plan.model import VllmCpuServer, VllmInstinctServer

    first = plan.decisions.first
    assert isinstance(first, VllmCpuServer | VllmInstinctServer), "offline"
    return first


def engine_args(process: AnyVllmServer) -> list[str]:
    """The engine arguments of the process the offline benchmark runs: `bench_engine_argv`
    of its typed invocation. A record from before the invocation has only its words
    (`pre_invocation_flags`): its model, then the sizing flags of `BENCH_ENGINE_FLAGS` and
    --enforce-eager they give."""
    from epycd.engines.vllm.plan.argv import bench_engine_argv, bench_sizing_argv
    from epycd.engines.vllm.plan.invocation import ENFORCE_EAGER_FLAG
    from epycd.engines.vllm.plan.model import pre_invocation_flags

    if process.invocation is not None:
        return bench_engine_argv(process.invocation)
    flags = pre_invocation_flags(process)
    args = ["--model", flags.words[0], *bench_sizing_argv(flags)]
    return args + ([ENFORCE_EAGER_FLAG] if flags.given(ENFORCE_EAGER_FLAG) else [])


def throughput_argv(plan: Plan, prompts: int, lengths: tuple[int, int], results: Path) -> list[str]:
    """`vllm bench throughput` with the endpoint's sizing, pinned as its unit pins it; the
    result goes to `results`/offline.json."""
    process = offline_target(plan)
    inside = results if process.runtime == "host" else Path(RESULT_IN_CONTAINER)
    out = f"{inside}/offline.json"
    args = [
        "bench", "throughput", *engine_args(process), "--dataset-name", "random",
        "--input-len", str(lengths[0]), "--output-len", str(lengths[1]),
        "--num-prompts", str(prompts), "--seed", "0", "--output-json", out,
    ]  # fmt: skip
    nodes = ",".join(map(str, process.numa_nodes))
    if process.runtime == "host":
        return [*numactl(process.cpus, nodes), str(process.vllm_executable), *args]
    argv = bench_argv(plan, args, results)
    run = argv.index("run") + 1
    flags = [f"--cpuset-cpus={process.cpus}", f"--cpuset-mems={nodes}", "--ipc=host"]
    flags += [f"--env={key}={value}" for key, value in sorted(process.env.items())]
    return [*argv[:run], *flags, *argv[run:]]


def numactl(cpus: str, nodes: str) -> list[str]:
    """The unit's CPUAffinity= and NUMAPolicy=bind for a process started here; numactl is a
    prerequisite of the offline benchmark on the host path."""
    found = shutil.which("numactl")
    if found is None:
        raise Refusal(
            "numactl is not installed: the offline benchmark pins vLLM as the unit does",
            fix="apt-get install numactl",
        )
    return [found, f"--physcpubind={cpus}", f"--membind={nodes}"]


def run_offline(
    plan: Plan, name: str, prompts: int, lengths: tuple[int, int], results: Path
) -> BenchRun:
    if answers(plan):
        raise Refusal(
            f"{name} is running: the offline benchmark needs its cores and memory",
            fix=f"epycctl stop {name}, run the benchmark, then epycctl start {name}",
        )
    argv = throughput_argv(plan, prompts, lengths, results)
    process = offline_target(plan)
    env = os.environ | process.env if process.runtime == "host" else None
    seqs = process.max_num_seqs
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    out = results / "offline.json"
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return BenchRun(concurrency=seqs, num_prompts=prompts,
                        error=f"exit {done.returncode}: " + " / ".join(tail))  # fmt: skip
    data: dict[str, Any] = read_json_object(out, TOOL_OUTPUT_MAX_BYTES, fix=RESULT_FIX)
    elapsed = float(data["elapsed_time"]) or time.monotonic() - started
    return BenchRun(
        concurrency=seqs,
        num_prompts=int(data["num_requests"]),
        output_throughput=int(data["num_requests"]) * lengths[1] / elapsed,
        completed=int(data["num_requests"]),
        duration=elapsed,
    )


def run_one(
    argv: list[str], label: str, result_file: Path, key: str | None = None
) -> dict[str, Any]:
    """Run one benchmark with a progress line on stderr; its saved metrics, or the error
    (never holding the key)."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=bench_env(key))
        while process.poll() is None:
            elapsed = time.monotonic() - started
            if elapsed > BENCH_TIMEOUT_S:
                process.kill()
            click.echo(f"\r{label}: running {elapsed:.0f} s", nl=False, err=True)
            time.sleep(PROGRESS_INTERVAL_S)
        click.echo(f"\r{label}: done in {time.monotonic() - started:.0f} s", err=True)
        log.seek(0)
        tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
    if process.returncode != 0 or not result_file.is_file():
        error = f"exit {process.returncode}: " + " / ".join(tail)
        return {"error": error.replace(key, "<api key>") if key else error}
    data = read_json_object(result_file, TOOL_OUTPUT_MAX_BYTES, fix=RESULT_FIX)
    return {key: data.get(key) for key in METRICS}


def offline_run(
    plan: Plan, name: str, prompts_per_concurrency: int, lengths: tuple[int, int]
) -> BenchRun:
    prompts = max(8, prompts_per_concurrency * plan.decisions.max_num_seqs)
    with tempfile.TemporaryDirectory(prefix="epycd-bench-") as folder:
        click.echo(f"offline: vllm bench throughput, {prompts} prompts ...", err=True)
        return run_offline(plan, name, prompts, lengths, Path(folder))


def serve_runs(
    plan: Plan,
    concurrencies: tuple[int, ...],
    prompts_per_concurrency: int,
    lengths: tuple[int, int],
) -> list[BenchRun]:
    """One `vllm bench serve` per concurrency, in order."""
    runs = []
    key = api_key(plan)
    with tempfile.TemporaryDirectory(prefix="epycd-bench-") as folder:
        results = Path(folder)
        for concurrency in concurrencies:
            prompts = max(8, prompts_per_concurrency * concurrency)
            file_name = f"c{concurrency}.json"
            inside = results if plan.decisions.runtime == "host" else Path(RESULT_IN_CONTAINER)
            args = serve_bench_args(plan, concurrency, prompts, lengths, f"{inside}/{file_name}")
            argv = bench_argv(plan, args, results)
            measured = run_one(argv, f"concurrency {concurrency}", results / file_name, key)
            runs.append(BenchRun(concurrency=concurrency, num_prompts=prompts, **measured))
    return runs
