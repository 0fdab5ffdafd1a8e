"""Benchmark: speculative decoding on this CPU, each method against the same server without it.

Run:  .venv/bin/python benchmarks/speculative.py --build CACHE      # the models, once
      .venv/bin/python benchmarks/speculative.py --runtime DIR --target T.gguf
          [--draft LABEL=D.gguf ...] [--ngram TYPE ...] [--draft-max N] [--concurrency 1 4]
          --out RESULT.json
      .venv/bin/python benchmarks/speculative.py --vllm MODEL_DIR [--vllm-venv VENV]
          [--ngram-k 4] [--ngram-max 4] --out RESULT.json
      .venv/bin/python benchmarks/speculative.py --render RESULT.json    # the markdown tables
(DIR: a llama.cpp runtime with bin/llama-server; CACHE: where `--build` keeps the ~100M test
model (tests/tools/tiny_model.py --size small), its GGUF files (bf16, Q8_0 by the pinned
converter, Q4_K_M by `llama quantize`) and drafts cut from its first layers
(tests/tools/draft_layers.py). Loopback only. Not a CI pass/fail: the figures go to
benchmarks/speculative-results.md.)

Configurations: the plain server (A) and each speculative one (B, C, ...), run as a
palindrome A B C ... C B A, so that a drift of the machine over the run falls on all alike;
A and A' (its second pass) give the noise. Each pass starts its own server on a free loopback
port, pinned to this process's CPUs (taskset), waits for /health, sends one warm-up request,
then at each concurrency a fixed set of prompts (real text: chunks of this Python's stdlib
sources, each prompt used once per server), max_tokens 128, temperature 0, ignore_eos,
streamed through httpx, and stops the server whatever happens. Measured: tok/s (completion
tokens over the wall time of the set), mean TTFT and TPOT ((last token - first token) /
(tokens - 1)) per request, and the server's own draft counters from its /metrics (llama.cpp
`llamacpp:spec_decode_num_draft_tokens_total` / `..._accepted_tokens_total`; vLLM
`vllm:spec_decode_num_draft_tokens_total` / `..._num_accepted_tokens_total`), read before
and after each set. Before each pass: the 1-minute load average (after waiting up to
--idle-wait s for it to fall under 1.0) and the CPUs' idle share over 2 s. Each pass's texts
are compared with the plain server's first pass: at temperature 0 speculation should not
change them (a target's batched verification can still flip a near-tie, which random
weights make common).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
SERVED = "bench"
MAX_TOKENS = 128
PROMPT_CHARS = 1200
START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 600.0
PROMPT_MODULES = (
    "functools.py",
    "heapq.py",
    "bisect.py",
    "csv.py",
    "dataclasses.py",
    "enum.py",
    "fractions.py",
    "pathlib.py",
    "statistics.py",
    "difflib.py",
    "calendar.py",
    "glob.py",
    "tokenize.py",
    "pprint.py",
    "ipaddress.py",
    "contextlib.py",
    "base64.py",
    "gettext.py",
    "queue.py",
    "sched.py",
    "shlex.py",
    "typing.py",
    "uuid.py",
    "zipfile.py",
)
DRAFT_COUNTERS = {
    "drafted": (
        "llamacpp:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_draft_tokens_total",
    ),
    "accepted": (
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ),
    "drafts": ("llamacpp:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total"),
}
DEFAULT_CACHE = Path("/var/cache/epyc-llm-test")


# --- prompts ------------------------------------------------------------------------------


def prompts() -> list[str]:
    """One chunk of each module, from the first line start after a third of the file."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks = []
    for name in PROMPT_MODULES:
        text = (stdlib / name).read_text(encoding="utf-8")
        start = text.index("\n", len(text) // 3) + 1
        chunks.append(text[start : start + PROMPT_CHARS])
    return chunks


# --- servers ------------------------------------------------------------------------------


@dataclass
class Config:
    label: str
    engine: str  # "llama.cpp" or "vllm"
    argv: list[str]  # without the port
    env: dict[str, str] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def wait_idle(limit_s: float) -> float:
    deadline = time.monotonic() + limit_s
    while load1() >= 1.0 and time.monotonic() < deadline:
        time.sleep(5)
    return load1()


def idle_percent(over_s: float = 2.0) -> float:
    """The CPUs' idle share over a short window: what the load average lags behind."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle0, total0 = sample()
    time.sleep(over_s)
    idle1, total1 = sample()
    return round(100 * (idle1 - idle0) / max(1, total1 - total0), 1)


class Server:
    """One server in its own session, its output in a log file; stop() always ends it."""

    def __init__(self, config: Config, work: Path) -> None:
        self.config = config
        self.port = free_port()
        self.log = work / f"{re.sub(r'[^A-Za-z0-9]+', '-', config.label)}-{self.port}.log"
        pin = ["taskset", "-c", ",".join(map(str, cpus()))]
        self.argv = [*pin, *config.argv, "--port", str(self.port)]
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        began = time.monotonic()
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=os.environ | self.config.env,
                start_new_session=True,
            )
        deadline = began + START_TIMEOUT_S
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.config.label}: exited: {self.refusal()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base}/health").status_code == 200:
                        return round(time.monotonic() - began, 2)
                time.sleep(0.25)
        raise RuntimeError(f"{self.config.label}: no /health within {START_TIMEOUT_S} s")

    def refusal(self) -> str:
        """The server's own reason: its last error lines."""
        lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        errors = [
            line
            for line in lines
            if re.search(r"Error|error:|Exception|not supported|NotImplemented", line)
        ]
        return " | ".join((errors or lines)[-3:])[-1500:]

    def stop(self) -> None:
        if self.process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(30)
                return
            except subprocess.TimeoutExpired:
                continue

    def counters(self) -> dict[str, float]:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        found: dict[str, float] = {}
        for key, names in DRAFT_COUNTERS.items():
            for line in text.splitlines():
                if line.startswith("#"):
                    continue
                metric, _, value = line.rpartition(" ")
                if metric.split("{")[0] in names:
                    found[key] = found.get(key, 0.0) + float(value)
        return found


# --- the client -----------------------------------------------------------------------------


@dataclass
class Request:
    ttft_ms: float
    tpot_ms: float | None
    tokens: int
    latency_s: float
    text: str


def one_request(client: httpx.Client, base: str, prompt: str) -> Request:
    body = {
        "model": SERVED,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.monotonic()
    first = last = None
    tokens = 0
    parts: list[str] = []
    # a new connection each time: llama-server (cpp-httplib) may close a kept-alive one
    # just as the next request goes out on it ("Server disconnected without sending a response")
    headers = {"Connection": "close"}
    with client.stream("POST", f"{base}/v1/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            texts = [choice.get("text") or "" for choice in chunk.get("choices", [])]
            parts += texts
            if any(texts):
                now = time.monotonic()
                first = first if first is not None else now
                last = now
    end = time.monotonic()
    if first is None or last is None:
        raise RuntimeError("no text streamed")
    tpot = (last - first) * 1000 / (tokens - 1) if tokens > 1 else None
    return Request(round((first - began) * 1000, 1), tpot, tokens, end - began, "".join(parts))


@dataclass
class SetResult:
    concurrency: int
    requests: int
    tok_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float | None
    completion_tokens: int
    wall_s: float
    texts: list[str] = field(default_factory=list)
    drafted: float | None = None
    accepted: float | None = None
    drafts: float | None = None
    acceptance: float | None = None


def run_set(server: Server, texts: list[str], concurrency: int) -> SetResult:
    from concurrent.futures import ThreadPoolExecutor

    before = server.counters()
    limits = httpx.Limits(max_connections=concurrency + 2)
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        began = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            done = list(pool.map(lambda text: one_request(client, server.base, text), texts))
        wall = time.monotonic() - began
    after = server.counters()
    tokens = sum(r.tokens for r in done)
    tpots = [r.tpot_ms for r in done if r.tpot_ms is not None]
    result = SetResult(
        concurrency=concurrency,
        requests=len(done),
        tok_s=round(tokens / wall, 1),
        mean_ttft_ms=round(sum(r.ttft_ms for r in done) / len(done), 1),
        mean_tpot_ms=round(sum(tpots) / len(tpots), 2) if tpots else None,
        completion_tokens=tokens,
        wall_s=round(wall, 2),
        texts=[r.text for r in done],
    )
    if after:
        for key in DRAFT_COUNTERS:
            if key in after:
                setattr(result, key, after[key] - before.get(key, 0.0))
        if result.drafted:
            result.acceptance = round((result.accepted or 0.0) / result.drafted, 3)
    return result


@dataclass
class Pass:
    label: str
    order: int
    load1_before: float
    idle_pct_before: float
    startup_s: float | None = None
    sets: list[SetResult] = field(default_factory=list)
    error: str | None = None


def run_pass(
    config: Config, order: int, work: Path, plan: list[tuple[int, list[str]]], idle_wait: float
) -> Pass:
    measured = Pass(config.label, order, wait_idle(idle_wait), idle_percent())
    server = Server(config, work)
    print(
        f"[{order}] {config.label}: load1 {measured.load1_before}, "
        f"idle {measured.idle_pct_before} %",
        flush=True,
    )
    try:
        measured.startup_s = server.start()
        warm = plan[0][1][0]
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            one_request(client, server.base, warm)
        for concurrency, texts in plan[1:]:
            result = run_set(server, texts, concurrency)
            measured.sets.append(result)
            shown = {k: v for k, v in asdict(result).items() if k != "texts"}
            print(f"    c={concurrency}: {shown}", flush=True)
    except (RuntimeError, httpx.HTTPError) as error:
        measured.error = f"{type(error).__name__}: {error} | log: {server.refusal()}"
        print(f"    error: {measured.error}", flush=True)
    finally:
        server.stop()
    return measured


def request_plan(concurrency: list[int], per_level: dict[int, int]) -> list[tuple[int, list[str]]]:
    """The warm-up prompt, then each level's own prompts: none is sent twice to one server."""
    texts = prompts()
    plan: list[tuple[int, list[str]]] = [(1, texts[:1])]
    at = 1
    for level in concurrency:
        count = per_level[level]
        if at + count > len(texts):
            raise SystemExit(f"only {len(texts)} prompts: ask for fewer requests")
        plan.append((level, texts[at : at + count]))
        at += count
    return plan


# --- configurations ---------------------------------------------------------------------------


def llama_configs(args: argparse.Namespace) -> list[Config]:
    server = str(args.runtime / "bin" / "llama-server")
    threads = str(len(cpus()))
    slots = str(max(args.concurrency))
    base = [
        server, "-m", str(args.target), "--host", "127.0.0.1", "--alias", SERVED,
        "-c", str(args.context * max(args.concurrency)), "-np", slots, "-t", threads,
        "-tb", threads, "--metrics", "--cache-ram", "0", "--no-webui",
    ]  # fmt: skip
    configs = [Config("no speculation", "llama.cpp", base)]
    for item in args.draft:
        label, _, path = item.partition("=")
        configs.append(
            Config(
                f"draft {label} (n-max {args.draft_max})",
                "llama.cpp",
                [
                    *base, "-md", path, "--spec-type", "draft-simple",
                    "--spec-draft-n-max", str(args.draft_max),
                    "--spec-draft-n-min", str(args.draft_min),
                    "--spec-draft-p-min", str(args.draft_p_min),
                    "-td", threads,
                ],
            )
        )  # fmt: skip
    for kind in args.ngram:
        configs.append(
            Config(f"{kind}", "llama.cpp", [*base, "--spec-type", kind, *args.ngram_arg])
        )
    return configs


def vllm_configs(args: argparse.Namespace, work: Path) -> list[Config]:
    tmp = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))
    env = {
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "vllm-cache" / "inductor"),
        "TMPDIR": str(tmp),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus())),
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }
    base = [
        str(args.vllm_venv / "bin" / "vllm"), "serve", str(args.vllm),
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--dtype", "bfloat16",
        "--max-model-len", "2048", "--max-num-seqs", str(max(args.concurrency)),
    ]  # fmt: skip
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.ngram_k,
        "prompt_lookup_max": args.ngram_max,
        "prompt_lookup_min": args.ngram_min,
    }
    return [
        Config("no speculation", "vllm", base, env),
        Config(
            f"ngram k={args.ngram_k} lookup {args.ngram_min}-{args.ngram_max}",
            "vllm",
            [*base, "--speculative-config", json.dumps(spec)],
            env,
        ),
    ]


# --- building the models --------------------------------------------------------------------


def build(cache: Path, runtime: Path, venv: Path, layers: list[int]) -> None:
    """The small model, its GGUF files and its layer-cut drafts, each skipped when present."""
    python = str(venv / "bin" / "python")
    tools = REPO / "tests" / "tools"
    model = cache / "small-model"
    gguf = cache / "small-gguf"
    converter = runtime / "converter"
    gguf.mkdir(parents=True, exist_ok=True)

    def run(*argv: str) -> None:
        print("+", " ".join(argv), flush=True)
        subprocess.run(argv, check=True)

    run(python, str(tools / "tiny_model.py"), "--cache", str(model), "--size", "small")

    def convert(folder: Path, name: str) -> None:
        for kind in ("bf16", "q8_0"):
            target = gguf / f"{name}-{kind}.gguf"
            if not target.exists():
                with tempfile.TemporaryDirectory() as out:
                    run(
                        python, str(tools / "tiny_gguf.py"), "--source", str(converter),
                        "--model", str(folder), "--out", out, "--type", kind,
                    )  # fmt: skip
                    shutil.move(Path(out) / f"tiny-{kind}.gguf", target)
        quantized = gguf / f"{name}-q4_k_m.gguf"
        if not quantized.exists():
            run(
                str(runtime / "bin" / "llama"), "quantize", str(gguf / f"{name}-bf16.gguf"),
                str(quantized), "Q4_K_M",
            )  # fmt: skip

    convert(model, "small")
    for count in layers:
        folder = cache / f"small-first{count}-model"
        if not (folder / "model.safetensors").exists():
            run(
                python, str(tools / "draft_layers.py"), "--model", str(model),
                "--layers", str(count), "--out", str(folder),
            )  # fmt: skip
        convert(folder, f"small-first{count}")


# --- the report -------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpu": model,
        "cpus": cpus(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def render(report: dict[str, Any]) -> str:
    out = []
    m = report["machine"]
    out.append(
        f"{m['date']}, {m['cpu']}, CPUs {m['cpus']}, {m['memory_gib']} GiB; "
        f"{report['engine']}, {report['settings'].get('target') or report['settings'].get('vllm')}"
    )
    levels = sorted({s["concurrency"] for p in report["passes"] for s in p["sets"]})
    for level in levels:
        out += [
            "",
            f"c={level}:",
            "",
            "| # | configuration | load1, idle % before | tok/s | mean TTFT ms | mean TPOT ms "
            "| acceptance | drafted / accepted | texts as pass 1 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        reference: list[str] = next(
            (
                s.get("texts", [])
                for p in report["passes"]
                for s in p["sets"]
                if s["concurrency"] == level
            ),
            [],
        )
        for p in report["passes"]:
            before = f"{p['load1_before']}, {p.get('idle_pct_before', '-')}"
            found = [s for s in p["sets"] if s["concurrency"] == level]
            if not found:
                out.append(f"| {p['order']} | {p['label']} | {before} | "
                           f"failed: {(p.get('error') or '')[:200]} | | | | | |")  # fmt: skip
                continue
            s = found[0]
            counts = f"{int(s['drafted'])} / {int(s['accepted'])}" if s.get("drafted") else "-"
            acc = f"{s['acceptance']:.3f}" if s.get("acceptance") is not None else "-"
            same = sum(a == b for a, b in zip(s.get("texts", []), reference, strict=False))
            out.append(
                f"| {p['order']} | {p['label']} | {before} | {s['tok_s']} | "
                f"{s['mean_ttft_ms']} | {s['mean_tpot_ms']} | {acc} | {counts} | "
                f"{same}/{len(reference)} |"
            )
        out += ["", *summary(report, level)]
    return "\n".join(out)


def summary(report: dict[str, Any], level: int) -> list[str]:
    """Per configuration: the mean of its two passes against the plain server's; beyond the
    noise only where the two passes of each do not overlap (both B passes above both A
    passes, or both below)."""
    by_label: dict[str, list[float]] = {}
    drafted: dict[str, float] = {}
    for p in report["passes"]:
        for s in p["sets"]:
            if s["concurrency"] == level:
                by_label.setdefault(p["label"], []).append(s["tok_s"])
                drafted[p["label"]] = drafted.get(p["label"], 0.0) + (s.get("drafted") or 0.0)
    base = by_label.get("no speculation")
    if not base or len(base) < 2:
        return []

    def spread(values: list[float]) -> float:
        return abs(values[0] - values[-1]) / (sum(values) / len(values)) * 100

    base_mean = sum(base) / len(base)
    lines = [f"plain server: {base_mean:.1f} tok/s mean, A-A' spread {spread(base):.1f} %"]
    for label, values in by_label.items():
        if label == "no speculation":
            continue
        mean = sum(values) / len(values)
        change = (mean / base_mean - 1) * 100
        apart = min(values) > max(base) or max(values) < min(base)
        verdict = "beyond the noise" if apart and len(values) > 1 else "within the noise"
        if not drafted.get(label):
            verdict += ", but nothing drafted: noise"
        lines.append(
            f"; {label}: {mean:.1f} tok/s mean, {change:+.1f} % "
            f"(B-B' spread {spread(values) if len(values) > 1 else float('nan'):.1f} %: {verdict})"
        )
    return ["".join(lines)]


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", type=Path, help="print a saved result as markdown")
    parser.add_argument("--build", type=Path, help="build the models into this cache folder")
    parser.add_argument("--draft-layers", type=int, nargs="*", default=[4], help="for --build")
    parser.add_argument("--runtime", type=Path, default=DEFAULT_CACHE / "llama-server")
    parser.add_argument("--target", type=Path, help="the target GGUF (llama.cpp)")
    parser.add_argument("--draft", action="append", default=[], help="LABEL=DRAFT.gguf")
    parser.add_argument("--draft-max", type=int, default=3, help="--spec-draft-n-max")
    parser.add_argument("--draft-min", type=int, default=0, help="--spec-draft-n-min")
    parser.add_argument("--draft-p-min", type=float, default=0.0, help="--spec-draft-p-min")
    parser.add_argument("--ngram", action="append", default=[], help="a llama.cpp --spec-type")
    parser.add_argument(
        "--ngram-arg", action="append", default=[], help="extra llama-server argument(s)"
    )
    parser.add_argument("--context", type=int, default=2048, help="llama.cpp context per slot")
    parser.add_argument("--vllm", type=Path, help="the safetensors model folder (vLLM)")
    parser.add_argument("--vllm-venv", type=Path, default=DEFAULT_CACHE / "vllm-venv")
    parser.add_argument("--ngram-k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--ngram-max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--ngram-min", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, nargs="+", default=[6, 8], help="per level")
    parser.add_argument("--idle-wait", type=float, default=30.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if args.build:
        build(args.build, args.runtime, args.vllm_venv, args.draft_layers)
        return 0
    if not args.out or bool(args.target) == bool(args.vllm):
        parser.error("--out and one of --target (llama.cpp) or --vllm")
    if len(args.requests) != len(args.concurrency):
        parser.error("--requests: one count per --concurrency level")
    plan = request_plan(args.concurrency, dict(zip(args.concurrency, args.requests, strict=True)))
    work = Path(tempfile.mkdtemp(prefix="spec-"))
    configs = vllm_configs(args, work) if args.vllm else llama_configs(args)
    order = configs + configs[::-1]
    report: dict[str, Any] = {
        "engine": configs[0].engine,
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "argv": {c.label: c.argv for c in configs},
        "prompt_modules": list(PROMPT_MODULES),
        "passes": [],
    }
    for index, config in enumerate(order, 1):
        measured = run_pass(config, index, work, plan, args.idle_wait)
        report["passes"].append(asdict(measured))
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} (server logs in {work})")
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
