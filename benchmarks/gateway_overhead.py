"""Benchmark: what the gateway costs. The same llama-server measured directly and through
the gateway (Debian's HAProxy with the configuration and maps epyc-llm renders for one
route and one client key), alternating, at each concurrency: output tokens/s and time to
the first token, by epycd's own client (`epycd.servebench.measure`: random prompts, the
server's own token counts, streamed).

Run:  .venv/bin/python benchmarks/gateway_overhead.py --model FILE.gguf \\
          [--concurrency 1 8 32] [--passes 4] [--input-len 128] [--output-len 64] \\
          [--threads 2] [--with-delay] [--gateway-threads N ...] \\
          [--engine-cpus CPU ...] --out RESULT.json
      .venv/bin/python benchmarks/gateway_overhead.py --render RESULT.json
(llama-server and HAProxy from the test cache, tests/bootstrap.sh; loopback only. Not a CI
pass/fail: the figures go to benchmarks/gateway-results.md.)
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
from serving import machine  # noqa: E402

from epycd.gateway.haproxy import gateway_files  # noqa: E402
from epycd.gateway.keys import KeyStore, add_key  # noqa: E402
from epycd.gateway.routes import Route  # noqa: E402
from epycd.servebench import measure, vocabulary_size  # noqa: E402
from tests.health.realvllm import free_port  # noqa: E402
from tests.llama.realllama import llama_server  # noqa: E402
from tests.render.test_balancer import cached_haproxy  # noqa: E402

SERVED = "bench"


def wait_for(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200")


def pinned(cpus: set[int] | None) -> list[str]:
    """taskset's words for `cpus`; none for None."""
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []


def start_server(
    model: Path, threads: int, slots: int, work: Path, cpus: set[int] | None = None
) -> tuple[Any, str]:
    port = free_port()
    process = subprocess.Popen(
        [*pinned(cpus), str(llama_server()), "-m", str(model), "--host", "127.0.0.1",
         "--port", str(port),
         "-t", str(threads), "-np", str(slots), "--alias", SERVED, "--metrics"],
        stdout=(work / "llama.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/health")
    return process, url


def start_gateway(
    server: str,
    work: Path,
    *,
    no_delay: bool = True,
    threads: int | None = None,
    cpus: set[int] | None = None,
) -> tuple[Any, str, str]:
    """HAProxy on the rendered files in `work`; without `no_delay`, with the configuration's
    `option http-no-delay` taken out (HAProxy's default: it lets the kernel hold small
    writes, such as one streamed token, to fill a segment); with `threads`, `nbthread` set
    to it instead of the configuration's own."""
    work.mkdir(exist_ok=True)
    store, key = add_key(KeyStore(), "bench", models=None, rpm=None, concurrency=None)
    route = Route(endpoint="bench", model=SERVED, primary_endpoint="completions",
                  address=server.removeprefix("http://"))  # fmt: skip
    port = free_port()
    files = gateway_files([route], store, listen=f"127.0.0.1:{port}", metrics_listen="",
                          folder=work, endpoint_keys={},
                          endpoint_keys_path=str(work / "none.map"))  # fmt: skip
    for name, text in files.files().items():
        if name == "haproxy.cfg" and not no_delay:
            assert "    option http-no-delay\n" in text
            text = text.replace("    option http-no-delay\n", "")
        if name == "haproxy.cfg" and threads is not None:
            kept = [line for line in text.splitlines() if not line.startswith("    nbthread ")]
            text = "\n".join(kept).replace("global\n", f"global\n    nbthread {threads}\n", 1)
            text += "\n"
        (work / name).write_text(text)
    binary, env = cached_haproxy()
    process = subprocess.Popen([*pinned(cpus), str(binary), "-f", str(work / "haproxy.cfg")],
                               env={**os.environ, **env},
                               stdout=(work / "haproxy.log").open("wb"),
                               stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/health")
    return process, url, key


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    slots = max(args.concurrency)
    engine_cpus = rest = None
    if args.engine_cpus:
        engine_cpus = set(args.engine_cpus)
        rest = os.sched_getaffinity(0) - engine_cpus
        os.sched_setaffinity(0, rest)  # the client, as HAProxy, off the engine's cores
    server, direct = start_server(args.model, args.threads, slots, work, engine_cpus)
    gateway, through, key = start_gateway(direct, work / "gateway", cpus=rest)
    vocabulary = vocabulary_size(direct, None)
    targets = {"direct": (direct, None), "gateway": (through, key)}
    processes = [gateway, server]
    if args.with_delay:
        delayed, delayed_url, delayed_key = start_gateway(
            direct, work / "delay", no_delay=False, cpus=rest
        )
        targets["gateway-without-no-delay"] = (delayed_url, delayed_key)
        processes.insert(0, delayed)
    for threads in args.gateway_threads:
        other, other_url, other_key = start_gateway(
            direct, work / f"threads-{threads}", threads=threads, cpus=rest
        )
        targets[f"gateway, nbthread {threads}"] = (other_url, other_key)
        processes.insert(0, other)
    rows = []
    try:
        for index in range(args.passes):
            for concurrency in args.concurrency:
                order = list(targets) if index % 2 == 0 else list(reversed(targets))
                for label in order:
                    url, client_key = targets[label]
                    measured = measure(
                        url, SERVED, client_key, concurrency=concurrency,
                        prompts=max(args.requests, 4 * concurrency), input_len=args.input_len,
                        output_len=args.output_len, vocabulary=vocabulary,
                    )  # fmt: skip
                    rows.append({"path": label, "pass": index + 1, "concurrency": concurrency,
                                 **measured.__dict__})  # fmt: skip
                    print(label, index + 1, concurrency,
                          f"{measured.output_throughput:.1f} tok/s",
                          f"TTFT {measured.mean_ttft_ms:.1f} ms", flush=True)  # fmt: skip
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(args.model),
        "threads": args.threads,
        "engine_cpus": args.engine_cpus,
        "slots": slots,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "rows": rows,
    }


def mean_of(report: dict[str, Any], path: str, concurrency: int, key: str) -> float:
    values = [float(r[key]) for r in report["rows"]
              if r["path"] == path and r["concurrency"] == concurrency]  # fmt: skip
    return statistics.mean(values)


def render(report: dict[str, Any]) -> str:
    lines = [
        "| path | c | tok/s | vs direct | mean TTFT ms | vs direct |",
        "|---|---|---|---|---|---|",
    ]
    paths = list(dict.fromkeys(row["path"] for row in report["rows"]))
    for c in sorted({row["concurrency"] for row in report["rows"]}):
        direct = mean_of(report, "direct", c, "output_throughput")
        direct_ttft = mean_of(report, "direct", c, "mean_ttft_ms")
        for path in paths:
            tps = mean_of(report, path, c, "output_throughput")
            ttft = mean_of(report, path, c, "mean_ttft_ms")
            lines.append(f"| {path} | {c} | {tps:.1f} | {100 * (tps / direct - 1):+.1f} % | "
                         f"{ttft:.1f} | {ttft - direct_ttft:+.1f} ms |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--with-delay",
        action="store_true",
        help="also a gateway without `option http-no-delay` (HAProxy's default)",
    )
    parser.add_argument(
        "--gateway-threads",
        type=int,
        nargs="*",
        default=[],
        help="also the gateway with `nbthread N` for each N (HAProxy's default: a thread per CPU)",
    )
    parser.add_argument(
        "--engine-cpus",
        type=int,
        nargs="*",
        default=[],
        help="pin llama-server to these CPUs, and HAProxy and the client to the others (a "
        "host whose gateway has a core the engine does not use)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--render", type=Path, help="reprint a result file")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if args.model is None or args.out is None:
        parser.error("--model and --out are needed to measure")
    report = run(args)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
