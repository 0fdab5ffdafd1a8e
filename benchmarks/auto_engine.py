"""Benchmark: what `engine = "auto"` (quickstart's default) serves for each profile, against
what an admin would run instead, on one ~100M safetensors model, in one run.

Run:  .venv/bin/python benchmarks/auto_engine.py [--concurrency 1 8 32] [--passes 2]
      .venv/bin/python benchmarks/auto_engine.py --render RESULT.json   # reprint a saved run
(needs tests/bootstrap.sh: the llama.cpp runtime with its converter and the vLLM venv, whose
Python runs the converter and whose `vllm bench serve` is the client; loopback only, no
network. Not a CI pass/fail: the figures go to benchmarks/auto-engine-results.md.)

The model: tests/tools/tiny_llama.py --size small (a Llama of ~100M parameters with seeded
random bf16 weights and a SentencePiece tokenizer, which llama.cpp's converter takes as it is),
built once into CACHE/small-llama. The product converts it itself (`epycd.engines.llama_cpp.
model.convert`, as `epycctl convert` and approve do) to Q8_0 (quantize's default) and Q4_K_M.

Configurations, each planned through `epycd.plan.pipeline.build.plan_all` against this
machine (under an EPYC identity where the product would refuse the CPU) and run as its unit
runs it (its arguments and environment, pinned with numactl as CPUAffinity= and
NUMAPolicy=bind pin the unit):
- **auto, PROFILE**: `engine = "auto"`, `profile = PROFILE`, the model folder: the engine the
  plan chose and its plan (llama.cpp on the converted Q8_0 file for latency and balanced,
  vLLM for throughput: docs/tuning.md rule 12);
- **the other engine, planned**: `engine = "vllm"` or `"llama.cpp"` with the same profile,
  where it differs from auto's choice;
- **auto, quantize = "q4_k_m"**: auto's llama.cpp plan on the weights Ollama serves;
- **Ollama's way**: `llama-server -m MODEL-Q4_K_M.gguf` and nothing else (Ollama's weights and
  llama-server's defaults);
- **plain vllm serve**: `vllm serve MODEL`, nothing else.
Identical command lines are measured once. Each: start-up (spawn to the first /health 200),
then `vllm bench serve` (OpenAI completions, random dataset, seed 0, --ignore-eos,
max(16, 4 x concurrency) prompts after as many warm-ups as the concurrency) at each
concurrency, and the server's peak PSS. With --passes 2 every configuration runs twice, the
second pass in reverse order (A B C C B A: a drift of the machine falls on all alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from llama_serving import bench, cores_and_node, cpu_name  # noqa: E402
from serving import PeakRss, load1, plan_here, stop_group, wait_healthy  # noqa: E402

from epycd.plan.endpoint import Plan  # noqa: E402
from tests.health.realvllm import CACHE, VENV, free_port  # noqa: E402
from tests.llama.realllama import SERVER  # noqa: E402

SERVED = "bench"
MODEL = CACHE / "small-llama"
CONVERTED = CACHE / "small-llama-converted"
PROFILES = ("latency", "balanced", "throughput")
PROFILE_CONCURRENCY = {"latency": 1, "balanced": 8, "throughput": 32}
"""The concurrency each profile is made for (docs/tuning.md): where auto is judged."""


@dataclass
class Config:
    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    roles: list[str] = field(default_factory=list)
    """What this command line is in the comparison (auto of a profile, Ollama's way, ...)."""


@dataclass
class Measured:
    label: str
    roles: list[str]
    argv: list[str]
    startup_s: float | None = None
    peak_pss_gib: float | None = None
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    refusal: str = ""
    pass_number: int = 1


def small_model() -> Path:
    """The ~100M SentencePiece Llama, built once (the vLLM venv's torch and sentencepiece)."""
    if not (MODEL / "model.safetensors").is_file():
        partial = MODEL.with_name(MODEL.name + ".new")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(
            [str(VENV / "bin" / "python"), str(REPO / "tests/tools/tiny_llama.py"),
             "--out", str(partial), "--size", "small"],
            check=True,
        )  # fmt: skip
        partial.rename(MODEL)
    return MODEL


def settings_for() -> dict[str, Any]:
    """The planner's settings: this repository's test runtimes, the converted files kept in
    CONVERTED (converted once)."""
    return {"llama_runtime_dir": SERVER, "runtime_dir": VENV, "llama_converted_dir": CONVERTED}


def converted(model: Path, quantize: str) -> Path:
    """The model converted as approve converts it (its file and record in the converted
    folder, where the planner looks)."""
    from epycd.engines.llama_cpp.model.convert import convert
    from epycd.engines.llama_cpp.plan.converted import converted_path, quantize_of, write_record

    target = converted_path(CONVERTED, str(model), None, quantize_of(quantize))
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        done = convert(
            str(model),
            runtime_dir=SERVER,
            python=str(VENV / "bin" / "python"),
            quantize=quantize_of(quantize),
            output=target,
        )
        write_record(done, None)
    return target


def plan_of(work: Path, lines: str) -> Plan:
    """One endpoint file planned on this machine, with this repository's test runtimes."""
    return plan_here(work, lines, host_usr=True, engine_settings=settings_for())


def pin(cpus: str, nodes: list[int]) -> list[str]:
    return ["numactl", f"--physcpubind={cpus}", f"--membind={','.join(map(str, nodes))}"]


def without_port(words: list[str]) -> list[str]:
    words = list(words)
    at = words.index("--port")
    del words[at : at + 2]
    return words


def planned_config(label: str, plan: Plan) -> Config:
    """What the plan's unit runs, pinned as the unit is."""
    from epycd.engines.llama_cpp.plan.model import LlamaServer
    from epycd.engines.vllm.plan.model import VllmCpuServer

    server = plan.decisions.first
    if isinstance(server, LlamaServer):
        argv = [*pin(server.cpus, server.numa_nodes), server.llama_server,
                *without_port(server.server_args)]  # fmt: skip
        return Config(label, argv)
    assert isinstance(server, VllmCpuServer), type(server)
    argv = [*pin(server.cpus, server.numa_nodes), str(VENV / "bin" / "vllm"), "serve",
            *without_port(server.vllm_args)]  # fmt: skip
    return Config(label, argv, env=dict(server.env))


def configs(work: Path, model: Path) -> list[Config]:
    converted(model, "q8_0")
    q4 = converted(model, "q4_k_m")
    base = f'model = "{model}"\nserved_model_name = "{SERVED}"\n'
    found: list[Config] = []
    for profile in PROFILES:
        auto = plan_of(work, f'engine = "auto"\nprofile = "{profile}"\n{base}')
        chosen = auto.decisions.engine
        found.append(planned_config(f"auto, {profile} ({chosen})", auto))
        other = "vllm" if chosen == "llama.cpp" else "llama.cpp"
        planned = plan_of(work, f'engine = "{other}"\nprofile = "{profile}"\n{base}')
        found.append(planned_config(f"{other} planned, {profile}", planned))
        q4_auto = plan_of(
            work, f'engine = "auto"\nprofile = "{profile}"\nquantize = "q4_k_m"\n{base}'
        )
        if q4_auto.decisions.engine == "llama.cpp":
            found.append(planned_config(f'auto, {profile}, quantize = "q4_k_m"', q4_auto))
    server = str(SERVER / "bin" / "llama-server")
    ollama = [server, "-m", str(q4), "--host", "127.0.0.1", "-a", SERVED]
    found.append(Config("Ollama's way: llama-server -m Q4_K_M", ollama))
    vllm = [str(VENV / "bin" / "vllm"), "serve", str(model), "--host", "127.0.0.1"]
    found.append(Config("plain vllm serve", [*vllm, "--served-model-name", SERVED]))
    return merged(found)


def merged(found: list[Config]) -> list[Config]:
    """One configuration per command line and environment, with every role it plays."""
    unique: dict[str, Config] = {}
    for config in found:
        key = json.dumps([config.argv, sorted(config.env.items())])
        kept = unique.setdefault(key, Config(config.label, config.argv, config.env))
        kept.roles.append(config.label)
    for config in unique.values():
        config.label = " = ".join(config.roles)
    return list(unique.values())


def server_env(config: Config, cache: Path) -> dict[str, str]:
    """The caller's environment without vLLM or epycd tuning, the configuration's own, and
    caches in `cache` (empty: each vLLM pays the same cold compile)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "EPYCD_"))}
    cache.mkdir(parents=True, exist_ok=True)
    return (
        base
        | {
            "HOME": str(cache),
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        }
        | config.env
    )


def measure(
    work: Path,
    model: Path,
    config: Config,
    concurrencies: list[int],
    lengths: tuple[int, int],
    pass_number: int,
) -> Measured:
    port = free_port()
    result = Measured(config.label, config.roles, config.argv, pass_number=pass_number)
    slug = f"{len(list(work.glob('*.log')))}"
    log = work / f"{slug}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*config.argv, "--port", str(port)],
            env=server_env(config, work / f"cache-{slug}"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    memory = PeakRss(process.pid, skip_root=False)
    try:
        if not wait_healthy(port, process):
            result.refusal = (log.read_text(errors="replace").strip().splitlines() or ["?"])[-1]
            return result
        result.startup_s = round(time.monotonic() - started, 2)
        label = f"{slug}-{config.roles[0]}"
        for concurrency in concurrencies:
            from llama_serving import Config as LlamaConfig

            run = bench(work, port, model, LlamaConfig(label, []), concurrency, lengths)
            result.runs[concurrency] = run
            print(f"  {config.label} c={concurrency}: {run}", flush=True)
        return result
    finally:
        stop_group(process)
        memory.stop()
        result.peak_pss_gib = memory.pss()[0]


def passes_tok_s(report: dict[str, Any], label: str, concurrency: int) -> list[float]:
    """A configuration's output tok/s at a concurrency, one per pass that measured it."""
    return [
        run["output_throughput"]
        for m in report["measured"]
        if m["label"] == label
        for c, run in m["runs"].items()
        if int(c) == concurrency and "output_throughput" in run
    ]


def tok_s(report: dict[str, Any], label: str, concurrency: int) -> float | None:
    """The mean output tok/s of a configuration's passes at a concurrency."""
    found = passes_tok_s(report, label, concurrency)
    return round(sum(found) / len(found), 1) if found else None


def render(report: dict[str, Any]) -> str:
    from llama_serving import measured_table

    lines = measured_table(
        report, "configuration (pass)", lambda m: f"{m['label']} ({m['pass_number']})"
    )
    concurrencies = report["settings"]["concurrency"]
    labels = list(dict.fromkeys(m["label"] for m in report["measured"]))
    lines += ["", "Each profile at its own concurrency, the mean of the passes (tok/s; the"]
    lines += ["passes' spread, (max - min) / mean, in brackets):", ""]
    lines += ["| profile (c) | auto | auto, quantize = q4_k_m | the best other | every other |"]
    lines += ["|---|---|---|---|---|"]
    for profile in PROFILES:
        c = PROFILE_CONCURRENCY[profile]
        if c not in concurrencies:
            continue
        auto = next((label for label in labels if label.startswith(f"auto, {profile} (")), None)
        quantized = next(
            (label for label in labels if label.startswith(f"auto, {profile}, quantize")), None
        )
        others = {
            label: tok_s(report, label, c)
            for label in labels
            if not label.startswith(f"auto, {profile}")
        }
        best = max(others.items(), key=lambda kv: kv[1] or 0.0)
        every = "; ".join(f"{label}: {value}" for label, value in others.items())
        lines.append(
            f"| {profile} (c={c}) | {cell(report, auto, c)} | {cell(report, quantized, c)} | "
            f"{best[0]}: {cell(report, best[0], c)} | {every} |"
        )
    return "\n".join(lines)


def cell(report: dict[str, Any], label: str | None, concurrency: int) -> str:
    """A configuration's mean tok/s at a concurrency, with its passes' spread."""
    found = passes_tok_s(report, label, concurrency) if label is not None else []
    if not found:
        return "-"
    mean = sum(found) / len(found)
    spread = f" [{100 * (max(found) - min(found)) / mean:.0f} %]" if len(found) > 1 else ""
    return f"{mean:.1f}{spread}"


def beside(report: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """`report` (a --llama-only rerun) with the configurations only `earlier` measured (its
    vLLM ones), their labels marked with its date."""
    measured = {m["label"] for m in report["measured"]}
    day = earlier["started"][:10]
    kept = [
        {**m, "label": f"{m['label']} [{day}]"}
        for m in earlier["measured"]
        if m["label"] not in measured
    ]
    return {**report, "measured": [*report["measured"], *kept]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/auto-engine-run1.json"))
    parser.add_argument("--render", type=Path)
    parser.add_argument(
        "--beside", type=Path, help="with --render: a saved run whose other configurations to add"
    )
    parser.add_argument("--list", action="store_true", help="print the configurations, run none")
    parser.add_argument(
        "--llama-only",
        action="store_true",
        help="only the configurations llama-server serves (a rerun of those beside a saved "
        "run's vLLM figures)",
    )
    args = parser.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        if args.beside:
            saved = beside(saved, json.loads(args.beside.read_text()))
        print(render(saved))
        return 0
    work = Path(tempfile.mkdtemp(prefix="auto-engine-"))
    model = small_model()
    found = configs(work, model)
    if args.llama_only:
        found = [c for c in found if any(w.endswith("/llama-server") for w in c.argv)]
    if args.list:
        for config in found:
            print(f"{config.label}:\n  {' '.join(config.argv)}\n  env {config.env}")
        return 0
    cpus, node = cores_and_node()
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.uname().nodename} ({cpu_name()}): CPUs {cpus} on NUMA node {node}; "
        f"{(SERVER / '.epyc-stamp').read_text().strip()}; load {load1()}",
        "settings": {
            "model": f"{model.name} (tests/tools/tiny_llama.py --size small)",
            "concurrency": args.concurrency,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "passes": args.passes,
            "llama_only": args.llama_only,
        },
        "configurations": [asdict(c) for c in found],
        "measured": [],
    }
    lengths = (args.input_len, args.output_len)
    for number in range(1, args.passes + 1):
        order = found if number % 2 else list(reversed(found))
        for config in order:
            print(f"pass {number}: {config.label}", flush=True)
            measured = measure(work, model, config, args.concurrency, lengths, number)
            report["measured"].append(asdict(measured))
            args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    print(f"\nwritten: {args.out}; logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
