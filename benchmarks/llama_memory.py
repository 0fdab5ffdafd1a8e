"""Benchmark: llama.cpp's own memory estimate (`llama fit-params`) against what llama-server holds.

Run:  .venv/bin/python benchmarks/llama_memory.py --runtime DIR --models A.gguf B.gguf
          [--cases 2048x1x512 8192x4x512] [--out benchmarks/llama-memory-run1.json]
      .venv/bin/python benchmarks/llama_memory.py --render RESULT.json   # reprint a saved run
(DIR: a llama.cpp runtime from packaging/llama-runtime.sh, with bin/llama-server and bin/llama;
loopback only; seconds per case. Not a CI pass/fail: the figures go to
benchmarks/llama-memory-results.md and, once judged, to data/footprint/llama.cpp/.)

A case is CONTEXTxSLOTSxUBATCH: `-c CONTEXT -np SLOTS -ub UBATCH` (with `--kv-unified`,
`--cache-ram 0`, `--fit off`, all the machine's cores). For each model and case: llama.cpp's
own estimate (`llama fit-params --fit-print on`: model, context and compute MiB, no weights
loaded), then the real server: its buffers as it logs them (model, repacked weights, KV,
compute, output), and the peak of its PSS and RSS while SLOTS requests run at once, each with
a prompt of half a slot's context (at most two ubatches: the compute peak is per ubatch).
What the estimate and the logged buffers leave unexplained is the server's own constant
(code, tokenizer, threads, HTTP), the one figure measured here for the plan's fit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

MIB = 1024**2
BUFFER_LINES = {
    "model_mib": re.compile(r"CPU_Mapped model buffer size = +([\d.]+) MiB"),
    "repack_mib": re.compile(r"CPU_REPACK model buffer size = +([\d.]+) MiB"),
    "kv_mib": re.compile(r"llama_kv_cache: size = +([\d.]+) MiB"),
    "compute_mib": re.compile(r"CPU compute buffer size = +([\d.]+) MiB"),
    "output_mib": re.compile(r"CPU +output buffer size = +([\d.]+) MiB"),
}


@dataclass
class Case:
    context: int
    slots: int
    ubatch: int

    @classmethod
    def parse(cls, text: str) -> Case:
        context, slots, ubatch = (int(part) for part in text.split("x"))
        return cls(context, slots, ubatch)

    @property
    def label(self) -> str:
        return f"{self.context}x{self.slots}x{self.ubatch}"

    def args(self) -> list[str]:
        """The sizing both commands take (`fit-params` has no --kv-unified: the cells are the
        same `-c` either way, shared or split among the slots)."""
        return [
            "-c", str(self.context), "-np", str(self.slots), "-ub", str(self.ubatch),
            "-b", str(max(self.ubatch, 2048)),
        ]  # fmt: skip


@dataclass
class Measured:
    model: str
    model_bytes: int
    case: str
    estimate_mib: dict[str, float] = field(default_factory=dict)
    logged_mib: dict[str, float] = field(default_factory=dict)
    peak_pss_mib: float = 0.0
    peak_rss_mib: float = 0.0
    load_s: float = 0.0
    constant_mib: float | None = None


def fit_print(runtime: Path, model: Path, case: Case) -> dict[str, float]:
    """`llama fit-params --fit-print on`'s last line: DEVICE MODEL CONTEXT COMPUTE (MiB)."""
    done = subprocess.run(
        [
            str(runtime / "bin" / "llama"),
            "fit-params",
            "-m",
            str(model),
            *case.args(),
            "--fit-print",
            "on",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    fields = done.stdout.split()[-4:]
    return dict(zip(("model", "context", "compute"), map(float, fields[1:]), strict=True))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def memory_of(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of the process in MiB, from smaps_rollup."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        values[name] = int(value.split()[0]) * 1024 / MIB
    return values["Pss"], values["Rss"]


def serve(runtime: Path, model: Path, case: Case, work: Path, measured: Measured) -> None:
    port = free_port()
    log = work / f"{model.stem}-{case.label}.log"
    argv = [
        str(runtime / "bin" / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
        "--port", str(port), "-a", "bench", "-t", str(os.cpu_count()), *case.args(), "--kv-unified",
        "--cache-ram", "0", "--fit", "off", "--no-ui", "-lv", "4",
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    peaks = [0.0, 0.0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and server.poll() is None:
            try:
                pss, rss = memory_of(server.pid)
            except (OSError, KeyError, ValueError):
                break
            peaks[0], peaks[1] = max(peaks[0], pss), max(peaks[1], rss)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, server, log)
        measured.load_s = round(time.monotonic() - started, 2)
        words = max(16, min(case.context // case.slots // 2, 2 * case.ubatch))
        prompt = " ".join(["the"] * words)

        def ask(_: int) -> None:
            httpx.post(
                f"{base}/v1/completions",
                json={"model": "bench", "prompt": prompt, "max_tokens": 16},
                timeout=600,
            ).raise_for_status()

        with ThreadPoolExecutor(case.slots) as pool:
            list(pool.map(ask, range(case.slots)))
    finally:
        stop.set()
        watcher.join()
        server.terminate()
        server.wait(30)
    measured.peak_pss_mib, measured.peak_rss_mib = round(peaks[0], 1), round(peaks[1], 1)
    text = log.read_text(errors="replace")
    for name, pattern in BUFFER_LINES.items():
        found = pattern.search(text)
        measured.logged_mib[name] = float(found.group(1)) if found else 0.0


def wait_healthy(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """/health is 503 while the model loads, 200 once it serves."""
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"llama-server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def machine(runtime: Path) -> dict[str, str]:
    lscpu = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            lscpu[key.strip()] = value.strip()
    stamp = (runtime / ".epyc-stamp").read_text().strip()
    return {
        "cpu": f"{lscpu.get('Model name')} (family {lscpu.get('CPU family')} model "
        f"{lscpu.get('Model')}), {lscpu.get('CPU(s)')} CPUs, "
        f"{lscpu.get('Thread(s) per core')} thread/core, NUMA nodes {lscpu.get('NUMA node(s)')}",
        "runtime": stamp,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Run {report['started']} on {report['machine']['cpu']}; {report['machine']['runtime']}",
        "",
        "| model | case CxSxUB | estimate model+ctx+compute MiB | logged model/repack/KV/compute/"
        "output MiB | peak PSS MiB | peak RSS MiB | constant MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in report["cases"]:
        est, log = case["estimate_mib"], case["logged_mib"]
        logged = "/".join(f"{log.get(k, 0):g}" for k in BUFFER_LINES)
        lines.append(
            f"| {case['model']} | {case['case']} | {est['model']:g}+{est['context']:g}+"
            f"{est['compute']:g} | {logged} | {case['peak_pss_mib']} | {case['peak_rss_mib']} "
            f"| {case['constant_mib']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", type=Path)
    parser.add_argument("--models", type=Path, nargs="+", default=[])
    parser.add_argument("--cases", nargs="+", default=["2048x1x512", "8192x4x512", "8192x4x2048"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/llama-memory-run1.json"))
    parser.add_argument("--render", type=Path)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "llama-memory"
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(args.runtime),
        "cases": [],
    }
    for model in args.models:
        for case in map(Case.parse, args.cases):
            measured = Measured(model.name, model.stat().st_size, case.label)
            measured.estimate_mib = fit_print(args.runtime, model, case)
            serve(args.runtime, model, case, work, measured)
            explained = sum(measured.logged_mib.values()) - measured.logged_mib["model_mib"]
            touched = min(measured.logged_mib["model_mib"], model.stat().st_size / MIB)
            measured.constant_mib = round(measured.peak_pss_mib - explained - touched, 1)
            report["cases"].append(asdict(measured))
            args.out.write_text(json.dumps(report, indent=1) + "\n")
            print(render(report).splitlines()[-1], flush=True)
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
