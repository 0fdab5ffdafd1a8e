"""Benchmark: an embedding (or reranker) endpoint as epyc-llm plans it against plain
`vllm serve MODEL` with vLLM's defaults and `llama-server` with its own, on this machine, in
one run.

Run:  .venv/bin/python benchmarks/pooling_serving.py --model FOLDER [--endpoint embeddings]
          [--concurrency 1 8 32] [--input-len 128] [--passes 2] [--requests 256]
          [--gguf FILE --llama-server PATH]   # the same model as GGUF, on llama.cpp too
          [--auto FILE [--auto-gguf-defaults]]  # engine = "auto" serving FILE as approve's
                                              # conversion (q8_0) of FOLDER
          [--onednn-isa AVX512_CORE_BF16]     # vLLM's matrix ISA capped to an EPYC's
      .venv/bin/python benchmarks/pooling_serving.py --render RESULT.json   # reprint a run
(FOLDER: a Hugging Face model folder vLLM serves as an embedder or reranker, such as the tests'
tiny BERT pair of tests/tools/tiny_pooling.sh. Needs tests/bootstrap.sh's vLLM venv; loopback
only. Not a CI pass/fail: the figures go to benchmarks/pooling-serving-results.md.)

Configurations:
- **defaults**: `vllm serve FOLDER --port P --served-model-name S`: vLLM's own choices (its
  runner `auto`, resolving to pooling; every core its OpenMP threads want; the KV space of
  its CPU default);
- **planned**: what epyc-llm's planner decides for an endpoint file of this model on this
  machine (docs/tuning.md rule 11: the host vLLM, `--runner pooling`, the model's own length,
  the profile's batch), its `vllm serve` words and environment, run under numactl with the
  plan's CPUs and NUMA nodes as its unit's CPUAffinity= and NUMAPolicy=bind do; planned by
  `epycd.plan.pipeline.build.plan_all` against this host (under an EPYC identity where the
  product would refuse the CPU, with this host's /usr in it, so that the plan finds its C++
  compiler as it would on the host itself and compiles: docs/tuning.md rule 4);
- with --gguf, **llama-defaults**: `llama-server -m FILE --embeddings` (or `--rerank`) and
  its alias, llama-server's own defaults otherwise (its 4 slots, context and batch of its
  own, every core its threads find); **llama-planned**: the planner's llama.cpp endpoint for
  the file (rule 9's encoder terms, rule 11: the context as batch, the profile's slots),
  its `server_args` under numactl with the plan's CPUs and NUMA nodes;
- with --auto FILE (and --llama-server), **auto-PROFILE** for balanced (quickstart's default)
  and throughput: the planner's endpoint for `engine = "auto"` and FOLDER, with FILE in the
  converted folder as approve's q8_0 conversion of FOLDER leaves it (its record beside it),
  the plan's `server_args` under numactl; and **llama-defaults-auto-file**: llama-server's
  defaults on FILE (`epycctl convert FOLDER --output FILE` makes it, as approve does; for the
  tests' tiny models, whose tokenizer the converter does not know, tests/tools/tiny_gguf.py).

With --onednn-isa ISA every vLLM server runs with ONEDNN_MAX_CPU_ISA=ISA. vLLM's matrix
products on the CPU are oneDNN's, which on an Intel host with AMX use AMX (and AVX512-FP16),
instructions no EPYC has; AVX512_CORE_BF16 (AVX-512 with VNNI and BF16) is what Zen 4 and
Zen 5 offer, so capped there vLLM multiplies as it would on an EPYC. llama-server needs no
cap: the product's recipe builds it without AMX (packaging/llama-runtime.sh).

Each pass starts each server (spawn to the first /health 200), then runs epycd's pooling
client (`epycd.servebench.measure_pooling`: random text of `--input-len` words, as many
warm-ups as the concurrency, max(--requests, 16 x concurrency) requests) at each concurrency:
requests/s, input tok/s, p50 and mean latency. Passes alternate the order (ABBA).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
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

from llama_serving import planned_config as llama_planned  # noqa: E402
from serving import machine, plan_here, stop_group, wait_healthy  # noqa: E402

from epycd.servebench import measure_pooling  # noqa: E402
from tests.health.realvllm import VENV, free_port, short_tmpdir  # noqa: E402

SERVED = "bench"


def planned(model: Path, work: Path) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """The planner's endpoint for `model` on this machine: its `vllm serve` argv (port left
    to the caller) under numactl, its environment, and what it decided."""
    from epycd.engines.vllm.plan.model import VllmCpuServer
    from epycd.host.cpulist import format_cpulist

    plan = plan_here(
        work,
        f'model = "{model}"\nruntime = "host"\nvllm = "{VENV / "bin" / "vllm"}"\n'
        f'served_model_name = "{SERVED}"\n',
        host_usr=True,  # the host's g++, as on an EPYC that has it (rule 4)
    )
    decided = plan.decisions.first
    assert isinstance(decided, VllmCpuServer)
    words = list(decided.vllm_args)
    at = words.index("--port")
    del words[at : at + 2]
    binding = ["numactl", f"--physcpubind={decided.cpus}",
               f"--membind={format_cpulist(decided.numa_nodes)}"]  # fmt: skip
    facts = {
        "vllm_args": decided.vllm_args,
        "env": decided.env,
        "max_num_seqs": decided.max_num_seqs,
        "max_num_batched_tokens": decided.max_num_batched_tokens,
        "kv_cache_gb": decided.kv_cache_gb,
        "cpus": decided.cpus,
    }
    return [*binding, str(VENV / "bin" / "vllm"), "serve", *words], dict(decided.env), facts


def defaults(model: Path) -> list[str]:
    return [str(VENV / "bin" / "vllm"), "serve", str(model), "--served-model-name", SERVED]


LLAMA_FLAGS = {"embeddings": "--embeddings", "rerank": "--rerank"}
"""The one flag llama-server needs to serve the path at all; the rest is its defaults."""


def llama_defaults(server: Path, gguf: Path, endpoint: str) -> list[str]:
    return [str(server), "-m", str(gguf), LLAMA_FLAGS[endpoint], "--alias", SERVED]


def configurations(args: argparse.Namespace, work: Path) -> tuple[Configs, dict[str, Any]]:
    """Each configuration's argv (its port added by `serve`) and environment, and what the
    planner decided for each engine."""
    plan_argv, plan_env, decided = planned(args.model, work)
    configs = {"defaults": (defaults(args.model), {}), "planned": (plan_argv, plan_env)}
    chosen = {"vllm": decided}
    if args.gguf:
        llama = llama_planned(args.llama_server, args.gguf, work / "llama")
        configs["llama-defaults"] = (
            llama_defaults(args.llama_server, args.gguf, args.endpoint),
            {},
        )
        configs["llama-planned"] = (llama.argv, {})
        chosen["llama.cpp"] = {"argv": llama.argv}
    if args.auto:
        auto = auto_configs(args, work)
        configs |= auto["configs"]
        chosen["auto"] = auto["chosen"]
    if args.onednn_isa:
        configs = {label: (argv, env | {"ONEDNN_MAX_CPU_ISA": args.onednn_isa})
                   if str(VENV / "bin" / "vllm") in argv else (argv, env)
                   for label, (argv, env) in configs.items()}  # fmt: skip
    return configs, chosen


AUTO_PROFILES = ("balanced", "throughput")


def auto_configs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """`engine = "auto"` for FOLDER in each of `AUTO_PROFILES`, `args.auto` standing as its
    q8_0 conversion: configuration label -> (argv, env); what each plan chose and why."""
    from auto_engine import planned_config as auto_planned

    from epycd.engines.llama_cpp.model.format import pinned_version
    from epycd.engines.llama_cpp.model.source import read_converted_source
    from epycd.engines.llama_cpp.plan.converted import ConvertedRecord, converted_path, record_path

    converted = work / "converted"
    target = converted_path(converted, str(args.model), None, "q8_0")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.auto, target)
    stat = target.stat()
    record = ConvertedRecord(source=str(args.model), source_revision=None, quantize="q8_0",
                             sha256=hashlib.sha256(target.read_bytes()).hexdigest(),
                             bytes=stat.st_size, mtime_ns=stat.st_mtime_ns,
                             llama_cpp=pinned_version(),
                             converted_from=read_converted_source(str(args.model), args.model,
                                                                  None))  # fmt: skip
    record_path(target).write_text(record.model_dump_json())
    settings = {"llama_runtime_dir": args.llama_server.parent.parent, "runtime_dir": VENV,
                "llama_converted_dir": converted}  # fmt: skip
    configs: dict[str, Any] = {}
    chosen: dict[str, Any] = {}
    for profile in AUTO_PROFILES:
        plan = plan_here(work, f'engine = "auto"\nprofile = "{profile}"\nmodel = "{args.model}"\n'
                         f'served_model_name = "{SERVED}"\n', host_usr=True,
                         engine_settings=settings)  # fmt: skip
        config = auto_planned(f"auto-{profile}", plan)
        configs[config.label] = (config.argv, config.env)
        choice = plan.decisions.engine_choice
        chosen[config.label] = {"engine": plan.decisions.engine, "argv": config.argv,
                                "reasons": choice.reasons if choice else []}  # fmt: skip
    configs["llama-defaults-auto-file"] = (
        llama_defaults(args.llama_server, args.auto, args.endpoint),
        {},
    )
    return {"configs": configs, "chosen": chosen}


def serve(argv: list[str], env: dict[str, str], work: Path, log: Path) -> tuple[Any, int, float]:
    port = free_port()
    full = (
        os.environ
        | {
            "TMPDIR": str(short_tmpdir()),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(work / "cache"),
        }
        | env
    )
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen([*argv, "--port", str(port)], env=full, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    if not wait_healthy(port, process):
        stop_group(process)
        raise SystemExit(f"{argv[:4]} did not get healthy: see {log}")
    return process, port, time.monotonic() - started


Configs = dict[str, tuple[list[str], dict[str, str]]]
"""Each configuration's argv (its port added by `serve`) and environment, by label."""


def measure_each(configs: Configs, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """`args.passes` passes, the order reversed every other one: each configuration started
    afresh and measured at each of `args.concurrency` on `args.endpoint` (`args.requests`,
    `args.input_len`), then stopped. One row per measurement."""
    runs = []
    for index in range(args.passes):
        order = list(configs) if index % 2 == 0 else list(reversed(configs))
        for label in order:
            argv, env = configs[label]
            process, port, startup = serve(argv, env, work, work / f"{label}.log")
            try:
                for concurrency in args.concurrency:
                    measured = measure_pooling(
                        f"http://127.0.0.1:{port}", SERVED, None, endpoint=args.endpoint,
                        concurrency=concurrency, prompts=max(args.requests, 16 * concurrency),
                        input_len=args.input_len,
                    )  # fmt: skip
                    runs.append({"config": label, "pass": index + 1, "concurrency": concurrency,
                                 "startup_s": round(startup, 1), **measured.__dict__})  # fmt: skip
                    print(label, index + 1, concurrency, f"{measured.request_throughput:.1f} req/s",
                          f"p50 {measured.p50_latency_ms:.1f} ms", flush=True)  # fmt: skip
            finally:
                stop_group(process)
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pooling-bench-"))
    (work / "llama").mkdir()
    configs, decided = configurations(args, work)
    runs = measure_each(configs, args, work)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(args.model),
        "endpoint": args.endpoint,
        "gguf": str(args.gguf) if args.gguf else None,
        "input_len": args.input_len,
        "onednn_isa": args.onednn_isa,
        "planned": decided,
        "runs": runs,
    }


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['measured_at']}, {report['machine']['cpu']}; {report['model']} on "
             f"/v1/{report['endpoint']}, {report['input_len']}-word inputs", "",
             "| concurrency | config | pass | req/s | input tok/s | p50 ms | mean ms |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in sorted(report["runs"], key=lambda r: (r["concurrency"], r["config"], r["pass"])):
        lines.append(f"| {run['concurrency']} | {run['config']} | {run['pass']} | "
                     f"{run['request_throughput']:.1f} | {run['input_throughput']:.0f} | "
                     f"{run['p50_latency_ms']:.1f} | {run['mean_latency_ms']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--endpoint", choices=("embeddings", "rerank"), default="embeddings")
    parser.add_argument("--gguf", type=Path, help="the same model as GGUF: llama-server too")
    parser.add_argument("--llama-server", type=Path, help="with --gguf: the llama-server")
    parser.add_argument(
        "--auto", type=Path, help='engine = "auto" with this GGUF as approve\'s q8_0 conversion'
    )
    parser.add_argument(
        "--onednn-isa", help="ONEDNN_MAX_CPU_ISA for the vLLM servers (AVX512_CORE_BF16: Zen 4/5's)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--requests", type=int, default=256, help="at least, per run")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--render", type=Path)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if args.model is None:
        parser.error("--model is required")
    if (args.gguf or args.auto) and not args.llama_server:
        parser.error("--gguf and --auto need --llama-server")
    report = run(args)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
