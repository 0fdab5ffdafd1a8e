"""Benchmark: an embedder's compute cores on each engine. vLLM's plan with its OpenMP bound
to one core (the other left to its front end, rule 1 for a chat endpoint) and to every core,
against the llama.cpp plan of its q8_0 file with one compute thread and with one per core;
vLLM's matrix products held to an EPYC's instructions (ONEDNN_MAX_CPU_ISA, as
pooling_serving.py --onednn-isa). One thread on each engine is the per-core comparison;
every core on each is what a small host gives.

Run:  .venv/bin/python benchmarks/pooling_cores.py --model FOLDER --gguf FILE \\
          --llama-server PATH [--rounds 2] [--onednn-isa AVX512_CORE_BF16] --out RESULT.json
(FOLDER: a Hugging Face embedder; FILE: its q8_0 conversion, `epycctl convert FOLDER`. Not a
CI pass/fail: the figures go to benchmarks/pooling-serving-results.md.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import pooling_serving as bench  # noqa: E402
from llama_serving import planned_config as llama_planned  # noqa: E402
from serving import machine  # noqa: E402

from epycd.host.cpulist import format_cpulist  # noqa: E402

CONCURRENCY = [1, 8, 32]


def with_threads(argv: list[str], threads: int) -> list[str]:
    argv = list(argv)
    for flag in ("--threads", "--threads-batch"):
        argv[argv.index(flag) + 1] = str(threads)
    return argv


def configurations(args: argparse.Namespace, work: Path) -> bench.Configs:
    vllm_argv, vllm_env, _ = bench.planned(args.model, work)
    cores = sorted(os.sched_getaffinity(0))
    isa = {"ONEDNN_MAX_CPU_ISA": args.onednn_isa} if args.onednn_isa else {}
    llama = llama_planned(args.llama_server, args.gguf, work / "llama").argv
    one, every = str(cores[0]), format_cpulist(cores)
    return {
        "vllm-omp-1-core": (vllm_argv, vllm_env | isa | {"VLLM_CPU_OMP_THREADS_BIND": one}),
        "vllm-omp-every-core": (vllm_argv, vllm_env | isa | {"VLLM_CPU_OMP_THREADS_BIND": every}),
        "llama-1-thread": (with_threads(llama, 1), {}),
        "llama-every-core": (with_threads(llama, len(cores)), {}),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pooling-cores-"))
    (work / "llama").mkdir()
    configs = configurations(args, work)
    passes = argparse.Namespace(passes=args.rounds, concurrency=CONCURRENCY, requests=256,
                                input_len=128, endpoint="embeddings")  # fmt: skip
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(args.model),
        "onednn_isa": args.onednn_isa,
        "configs": {label: {"argv": argv, "env": env} for label, (argv, env) in configs.items()},
        "runs": bench.measure_each(configs, passes, work),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--onednn-isa", default="AVX512_CORE_BF16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.write_text(json.dumps(run(args), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
