"""Benchmark: what a cold request costs, for an endpoint started by its first request.

systemd's socket activation as an on-demand endpoint would use it: `systemd-socket-activate`
holds the port and, at the first connection, starts a launcher with the listening socket.
The launcher does what the endpoint's units would do in order: it starts the planned engine
(the planner's own server command for this machine, pinned as its unit pins it), runs the
product's health gate (`epycd.health.run_gate`: /health, /v1/models, one real request), and
then becomes `systemd-socket-proxyd`, which takes the socket and the waiting connection and
passes them to the engine. The client's request waits in the socket's backlog meanwhile.

Per round, for each engine: the cold request's time to the first streamed token and to its
end (one chat completion), then warm requests at concurrency 1 through the same proxy, and
warm requests straight to the engine (what the proxy costs). Rounds alternate the engines.

Run:  .venv/bin/python benchmarks/cold_start.py [--engines llama.cpp vllm] [--rounds 3] \\
          [--warm 5] --out RESULT.json
      .venv/bin/python benchmarks/cold_start.py --render RESULT.json
(the engines and models of the test cache, tests/bootstrap.sh; systemd's own tools from
Debian; loopback only. On a CPU without zentorch's instructions (Intel), EPYC_TEST_VLLM=stock
runs vLLM with zentorch hidden, its stock CPU backend, as the tests do. Not a CI pass/fail:
the figures go to benchmarks/on-demand-results.md.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import httpx  # noqa: E402
from runs import parse_run  # noqa: E402
from serving import machine, plan_here, stop_group  # noqa: E402

from epycd.host.cpulist import format_cpulist  # noqa: E402
from tests.health.realvllm import (  # noqa: E402
    CACHE,
    ServingTest,
    free_port,
    tiny_model,
    vllm_env,
    vllm_executable,
)
from tests.llama.realllama import llama_server  # noqa: E402

SOCKET_ACTIVATE = "/usr/bin/systemd-socket-activate"
PROXYD = "/lib/systemd/systemd-socket-proxyd"
SERVED = "bench"
TINY_GGUF = CACHE / "tiny-gguf" / "tiny-q8_0.gguf"
MAX_TOKENS = 16
COLD_TIMEOUT_S = 900.0
LAUNCHER = """
import json, os, sys, subprocess, time
sys.path.insert(0, {repo!r})
from epycd.health import GateConfig, run_gate
command, env, url, log, proxyd, back = {command!r}, {env!r}, {url!r}, {log!r}, {proxyd!r}, {back!r}
started = time.time()
engine = subprocess.Popen(command, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
result = run_gate(GateConfig(url=url, served_model_name={served!r}, load_timeout=900),
                  lambda: engine.poll() is None)
with open(log + ".times", "w") as out:
    out.write(json.dumps({{"engine_spawned": started, "gate_passed": time.time(),
                          "ok": result.ok, "reason": result.reason}}))
if not result.ok:
    sys.exit(1)
os.execv(proxyd, [proxyd, "--exit-idle-time=300s", back])
"""


def planned_command(engine: str, work: Path) -> tuple[list[str], dict[str, str], int]:
    """The planner's server command for this engine's tiny model on this machine, pinned as
    its unit pins it, on a port of its own; its environment and the port."""
    port = free_port()
    if engine == "llama.cpp":
        toml = (f'engine = "llama.cpp"\nmodel = "{TINY_GGUF}"\nllama_server = "{llama_server()}"\n'
                f'served_model_name = "{SERVED}"\nport = {port}\n')  # fmt: skip
    else:
        vllm = vllm_executable()  # EPYC_TEST_VLLM=stock: zentorch hidden, as on Intel
        toml = (f'model = "{tiny_model()}"\nvllm = "{vllm}"\nruntime = "host"\n'
                f'served_model_name = "{SERVED}"\nmax_model_len = 512\n'
                f"port = {port}\n")  # fmt: skip
    (work / engine).mkdir(parents=True, exist_ok=True)
    plan = plan_here(work / engine, toml)
    decided: Any = plan.decisions.first
    pin = ["numactl", f"--physcpubind={decided.cpus}",
           f"--membind={format_cpulist(decided.numa_nodes)}"]  # fmt: skip
    if engine == "llama.cpp":
        return [*pin, decided.llama_server, *decided.server_args], dict(os.environ), port
    ServingTest.marked = True  # a benchmark runs alone; vllm_env guards the test suite
    env = vllm_env(work) | dict(decided.env)
    return [*pin, str(decided.vllm_executable), "serve", *decided.vllm_args], env, port


def chat(url: str) -> tuple[float, float]:
    """One streamed chat completion: seconds to the first token and to the end."""
    body = {"model": SERVED, "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": MAX_TOKENS, "stream": True}  # fmt: skip
    started = time.monotonic()
    first = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                      timeout=COLD_TIMEOUT_S) as reply:  # fmt: skip
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.monotonic() - started
    total = time.monotonic() - started
    return (first if first is not None else total), total


def one_round(engine: str, warm: int, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    command, env, back_port = planned_command(engine, work)
    front = free_port()
    log = work / f"{engine}.log"
    launcher = LAUNCHER.format(
        repo=str(REPO), command=command, env=env, url=f"http://127.0.0.1:{back_port}",
        log=str(log), proxyd=PROXYD, back=f"127.0.0.1:{back_port}", served=SERVED,
    )  # fmt: skip
    activator = subprocess.Popen(
        [SOCKET_ACTIVATE, "-l", f"127.0.0.1:{front}", sys.executable, "-c", launcher],
        stdout=(work / "activate.log").open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(0.5)  # the activator listens; nothing else runs yet
        sent = time.time()
        cold_first, cold_total = chat(f"http://127.0.0.1:{front}")
        times = json.loads(Path(f"{log}.times").read_text())
        proxied = [chat(f"http://127.0.0.1:{front}") for _ in range(warm)]
        direct = [chat(f"http://127.0.0.1:{back_port}") for _ in range(warm)]
    finally:
        stop_group(activator)
        subprocess.run(["pkill", "-f", "--", f"--port {back_port}"], check=False)
    return {
        "engine": engine,
        "cold_ttft_s": cold_first,
        "cold_total_s": cold_total,
        "engine_start_to_gate_s": times["gate_passed"] - times["engine_spawned"],
        "request_to_engine_spawn_s": times["engine_spawned"] - sent,
        "warm_ttft_s": statistics.median(first for first, _ in proxied),
        "warm_total_s": statistics.median(total for _, total in proxied),
        "direct_ttft_s": statistics.median(first for first, _ in direct),
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Machine: {report['machine']['cpu']}; {report['machine']['memory']}",
        "",
        "| engine | rounds | cold TTFT s | engine start to gate s | warm TTFT s (proxy) "
        "| warm TTFT s (direct) | cold / warm |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine in report["engines"]:
        rounds = [r for r in report["rounds"] if r["engine"] == engine]
        if not rounds:
            continue

        def median(key: str, rounds: list[dict[str, Any]] = rounds) -> float:
            return float(statistics.median(r[key] for r in rounds))

        lines.append(
            f"| {engine} | {len(rounds)} | {median('cold_ttft_s'):.3f} "
            f"| {median('engine_start_to_gate_s'):.3f} | {median('warm_ttft_s'):.4f} "
            f"| {median('direct_ttft_s'):.4f} "
            f"| {median('cold_ttft_s') / median('warm_ttft_s'):.0f}x |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["llama.cpp", "vllm"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parse_run(parser, render)
    if args is None:
        return 0
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "engines": args.engines,
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="cold-") as tmp:
        for number in range(args.rounds):
            for engine in args.engines if number % 2 == 0 else args.engines[::-1]:
                result = one_round(engine, args.warm, Path(tmp) / f"{engine}-{number}")
                print(json.dumps(result), flush=True)
                report["rounds"].append(result)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
