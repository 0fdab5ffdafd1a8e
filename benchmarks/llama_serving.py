"""Benchmark: llama-server as Ollama runs it (its defaults, `--numa distribute`) against the
pinned configurations the llama.cpp plan will choose from, by slot count, in one run.

Run:  .venv/bin/python benchmarks/llama_serving.py --runtime DIR --model FILE.gguf
          --tokenizer TOKENIZER_DIR [--concurrency 1 8 32] [--slots 1 4 8 16] [--planned]
          [--passes 2] [--ablate]
      .venv/bin/python benchmarks/llama_serving.py --render RESULT.json   # reprint a saved run
(DIR: a runtime from packaging/llama-runtime.sh; TOKENIZER_DIR: the model's tokenizer as
transformers saves it, for the bench client's random prompts: `AutoTokenizer.from_pretrained(
folder, gguf_file=...)` then `save_pretrained` reads it out of the GGUF itself. Needs
tests/bootstrap.sh's vLLM venv for `vllm bench serve`; loopback only. Not a CI pass/fail: the
figures go to benchmarks/llama-serving-results.md.)

Configurations:
- **defaults**: `llama-server -m FILE`, nothing else: what Ollama and a first try run (its
  threads are the physical cores, 4 slots sharing one KV cache of the model's whole training
  context, an 8 GiB prompt cache in RAM);
- **defaults --numa distribute**: the same with llama.cpp's own NUMA spreading;
- **pinned, S slots**: the instance's cores and NUMA node bound from outside (numactl, as the
  unit's CPUAffinity= and NUMAPolicy= will), `-t`/`-tb` = those cores, `-np S` slots sharing a
  KV pool of S x the context (`--kv-unified --kv-unified-per-slot`), no prompt cache, no
  auto-fit;
- **planned** (`--planned`): what epyc-llm's planner decides for a llama.cpp endpoint of this
  file on this machine (docs/tuning.md rule 10: its `server_args`, run under numactl with the
  plan's CPUs and NUMA nodes as its unit's CPUAffinity= and NUMAPolicy=bind do), planned
  through `epycd.plan.pipeline.build.plan_all` against this host (under an EPYC identity where the
  product would refuse the CPU).

Each: start-up (spawn to the first /health 200), then vLLM's own `vllm bench serve` (the
OpenAI completions API, random dataset, seed 0, --ignore-eos, max(16, 4 x concurrency)
prompts after as many warm-ups as the concurrency) at each concurrency, and the server's peak
PSS and RSS. The 1-minute load average is recorded with each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from serving import (  # noqa: E402
    BENCH_TIMEOUT_S,
    METRICS,
    PeakRss,
    load1,
    plan_here,
    stop_group,
    wait_healthy,
)

from tests.health.realvllm import VENV, free_port  # noqa: E402

SERVED = "bench"
CONTEXT = 4096
"""Each slot's context: room for the random 128 + 128 tokens and more."""


@dataclass
class Config:
    label: str
    argv: list[str]


@dataclass
class Measured:
    label: str
    startup_s: float | None = None
    peak_pss_gib: float | None = None
    peak_rss_gib: float | None = None
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    refusal: str | None = None


def cores_and_node() -> tuple[list[int], int]:
    """This process's CPUs and the NUMA node of the first one (the test VMs have one)."""
    cpus = sorted(os.sched_getaffinity(0))
    node = next(
        int(path.name.removeprefix("node"))
        for path in Path("/sys/devices/system/node").glob("node[0-9]*")
        if (path / f"cpu{cpus[0]}").exists()
    )
    return cpus, node


def cpu_name() -> str:
    """The CPU's name, family and model as /proc/cpuinfo gives them (a VM's name may be bare)."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return (
        f"{fields.get('model name')}, family {fields.get('cpu family')} model {fields.get('model')}"
    )


def pinned_parts(count: int) -> dict[str, list[str]]:
    """The pinned configuration of `count` slots, by what each group of its words sets."""
    cpus, node = cores_and_node()
    threads = str(len(cpus))
    return {
        "binding": ["numactl", f"--physcpubind={','.join(map(str, cpus))}", f"--membind={node}"],
        "threads": ["-t", threads, "-tb", threads],
        "pool": [
            "-np", str(count), "-c", str(count * CONTEXT),
            "--kv-unified", "--kv-unified-per-slot", str(CONTEXT),
        ],
        "no prompt cache": ["--cache-ram", "0"],
        "no auto-fit": ["--fit", "off"],
    }  # fmt: skip


def planned_config(server: Path, model: Path, work: Path) -> Config:
    """The planner's llama.cpp endpoint for `model` on this machine, its port left to
    `measure`."""
    from epycd.engines.llama_cpp.plan.model import LlamaServer
    from epycd.host.cpulist import format_cpulist

    plan = plan_here(
        work,
        f'engine = "llama.cpp"\nmodel = "{model}"\nllama_server = "{server}"\n'
        f'served_model_name = "{SERVED}"\n',
    )
    decided = plan.decisions.first
    assert isinstance(decided, LlamaServer)
    words = list(decided.server_args)
    at = words.index("--port")
    del words[at : at + 2]
    binding = [
        "numactl",
        f"--physcpubind={decided.cpus}",
        f"--membind={format_cpulist(decided.numa_nodes)}",
    ]
    return Config("planned", [*binding, decided.llama_server, *words])


def with_value(words: list[str], flag: str, value: str) -> list[str]:
    changed = list(words)
    changed[changed.index(flag) + 1] = value
    return changed


def planned_variants(plan: Config) -> list[Config]:
    """The planned endpoint with one of its choices undone (`--planned --ablate`): its KV pool
    as llama-server's default sizes it (one slot's context, shared by the slots), its weights
    mapped but not locked."""
    per_slot = plan.argv[plan.argv.index("--kv-unified-per-slot") + 1]
    shared = with_value(plan.argv, "--ctx-size", per_slot)
    return [
        Config(f"planned, one shared pool of {per_slot}", shared),
        Config("planned, weights not locked", with_value(plan.argv, "--load-mode", "mmap")),
    ]


def configs(server: Path, model: Path, slots: list[int], ablate: bool = False) -> list[Config]:
    """`ablate`: also the first slot count's pinned configuration without each group of its
    words in turn (which of them costs, where the pinned one loses)."""
    base = [str(server), "-m", str(model), "--host", "127.0.0.1", "-a", SERVED]
    found = [
        Config("defaults", base),
        Config("defaults --numa distribute", [*base, "--numa", "distribute"]),
    ]
    for count in slots:
        parts = pinned_parts(count)

        def argv(without: str | None = None, parts: dict[str, list[str]] = parts) -> list[str]:
            kept = {name: words for name, words in parts.items() if name != without}
            server_words = [w for name, words in kept.items() if name != "binding" for w in words]
            return [*kept.get("binding", []), *base, *server_words, "--no-ui"]

        found.append(Config(f"pinned, {count} slots", argv()))
        if ablate and count == slots[0]:
            for name in parts:
                found.append(Config(f"pinned, {count} slots, without {name}", argv(name)))
    return found


def bench(
    work: Path,
    port: int,
    tokenizer: Path,
    config: Config,
    concurrency: int,
    lengths: tuple[int, int],
) -> dict[str, Any]:
    name = f"{config.label}-c{concurrency}.json".replace(" ", "_").replace(",", "")
    prompts = max(16, 4 * concurrency)
    argv = [
        str(VENV / "bin" / "vllm"), "bench", "serve", "--backend", "openai",
        "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
        "--model", SERVED, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(lengths[0]),
        "--random-output-len", str(lengths[1]), "--ignore-eos",
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--seed", "0", "--num-warmups", str(concurrency), "--disable-tqdm",
        "--save-result", "--result-dir", str(work), "--result-filename", name,
    ]  # fmt: skip
    load = load1()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env |= {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        return {"error": " / ".join((done.stderr or done.stdout).strip().splitlines()[-5:])}
    data = json.loads((work / name).read_text())
    return {key: data.get(key) for key in METRICS} | {"prompts": prompts, "load": load}


def measure(
    work: Path, tokenizer: Path, config: Config, concurrencies: list[int], lengths: tuple[int, int]
) -> Measured:
    port = free_port()
    result = Measured(config.label)
    log = work / f"{config.label.replace(' ', '_').replace(',', '')}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*config.argv, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    memory = PeakRss(process.pid, skip_root=False)
    try:
        if not wait_healthy(port, process):
            result.refusal = log.read_text(errors="replace").strip().splitlines()[-1:][0]
            return result
        result.startup_s = round(time.monotonic() - started, 2)
        for concurrency in concurrencies:
            run = bench(work, port, tokenizer, config, concurrency, lengths)
            result.runs[concurrency] = run
            print(f"  {config.label} c={concurrency}: {run}", flush=True)
        return result
    finally:
        stop_group(process)
        result.peak_rss_gib = memory.stop()
        result.peak_pss_gib = memory.pss()[0]


def render(report: dict[str, Any]) -> str:
    return "\n".join(measured_table(report))


def measured_table(
    report: dict[str, Any],
    column: str = "configuration",
    label_of: Callable[[dict[str, Any]], str] = lambda measured: str(measured["label"]),
) -> list[str]:
    """The run's head line and a row per measured configuration (`label_of` names it under
    `column`): start-up, each concurrency's tok/s, TTFT, TPOT and requests done, peak PSS."""
    concurrencies = report["settings"]["concurrency"]
    head = " | ".join(f"c={c} tok/s, TTFT ms, TPOT ms (done)" for c in concurrencies)
    lines = [
        f"Run {report['started']}: {report['machine']}; model {report['settings']['model']}",
        "",
        f"| {column} | start-up s | {head} | peak PSS GiB |",
        "|---|---|" + "---|" * len(concurrencies) + "---|",
    ]
    for measured in report["measured"]:
        cells = []
        for c in concurrencies:
            run = measured["runs"].get(str(c)) or measured["runs"].get(c) or {}
            if "output_throughput" in run:
                cells.append(
                    f"{run['output_throughput']:.1f}, {run['mean_ttft_ms']:.0f}, "
                    f"{run['mean_tpot_ms']:.1f} ({run['completed']}/{run['prompts']})"
                )
            else:
                cells.append(str(run.get("error", measured.get("refusal") or "-"))[:60])
        lines.append(
            f"| {label_of(measured)} | {measured['startup_s']} | {' | '.join(cells)} | "
            f"{measured['peak_pss_gib']} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", type=Path)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokenizer", type=Path)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--slots", type=int, nargs="*", default=[])
    parser.add_argument(
        "--planned",
        action="store_true",
        help="also the planner's endpoint (docs/tuning.md rule 10)",
    )
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/llama-serving-run1.json"))
    parser.add_argument(
        "--passes",
        type=int,
        default=1,
        help="run every configuration this many times, every other pass in reverse order "
        "(A B, B A: a drift of the machine over the run falls on both alike)",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="also the first slot count's pinned configuration without each group of its "
        "flags, and with --planned the planned one with its pool or its locking undone",
    )
    parser.add_argument("--render", type=Path)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    cpus, node = cores_and_node()
    stamp = (args.runtime / ".epyc-stamp").read_text().strip()
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.uname().nodename} ({cpu_name()}): CPUs {cpus} on NUMA node {node}; "
        f"{stamp}",
        "settings": {
            "model": args.model.name,
            "concurrency": args.concurrency,
            "input_len": args.input_len,
            "output_len": args.output_len,
        },
        "measured": [],
    }
    work = Path(tempfile.mkdtemp(prefix="llama-serving-"))
    server = args.runtime / "bin" / "llama-server"
    lengths = (args.input_len, args.output_len)
    planned = configs(server, args.model, args.slots, ablate=args.ablate)
    if args.planned:
        plan = planned_config(server, args.model.resolve(), work)
        planned += [plan, *planned_variants(plan)] if args.ablate else [plan]
    for number in range(args.passes):
        for config in planned if number % 2 == 0 else planned[::-1]:
            measured = measure(work, args.tokenizer, config, args.concurrency, lengths)
            if args.passes > 1:
                measured.label = f"{config.label} (pass {number + 1})"
            report["measured"].append(asdict(measured))
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
