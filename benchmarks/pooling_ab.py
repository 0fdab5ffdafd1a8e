"""Benchmark: the vLLM pooling plan against vLLM's defaults, many short alternations, with
the one launch difference between them (numactl's CPU and memory binding, as the unit's
CPUAffinity= and NUMAPolicy=bind) crossed in: `planned`, `planned` without numactl,
`defaults`, and `defaults` under the plan's numactl. One server at a time, each started
afresh for its measurement (a start moves a configuration's figure by up to 20 % on a 2-core
VM), in an order reversed every other round, so that many rounds average the start-to-start
spread out.

Run:  .venv/bin/python benchmarks/pooling_ab.py --model FOLDER [--rounds 8]
          [--concurrency 1 8] [--requests 256] --out RESULT.json
(FOLDER: a Hugging Face embedding model folder, such as tests/tools/tiny_pooling.sh's BERT
embedder. Not a CI pass/fail: the figures go to benchmarks/pooling-serving-results.md.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import pooling_serving as bench  # noqa: E402
from serving import machine, stop_group  # noqa: E402

from epycd.servebench import measure_pooling  # noqa: E402


def configurations(model: Path, work: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    planned, env, _ = bench.planned(model, work)
    binding, bare = planned[:3], planned[3:]
    assert binding[0] == "numactl", planned
    defaults = bench.defaults(model)
    return {
        "defaults": (defaults, {}),
        "planned": (planned, env),
        "planned-no-numactl": (bare, env),
        "defaults-numactl": (binding + defaults, {}),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pooling-ab-"))
    configs = configurations(args.model, work)
    rows = []
    for index in range(args.rounds):
        order = list(configs) if index % 2 == 0 else list(reversed(configs))
        for label in order:
            argv, env = configs[label]
            process, port, _ = bench.serve(argv, env, work, work / f"{label}.log")
            try:
                for concurrency in args.concurrency:
                    measured = measure_pooling(
                        f"http://127.0.0.1:{port}", bench.SERVED, None, endpoint="embeddings",
                        concurrency=concurrency, prompts=max(args.requests, 16 * concurrency),
                        input_len=args.input_len,
                    )  # fmt: skip
                    rows.append({"config": label, "round": index + 1, "concurrency": concurrency,
                                 "request_throughput": measured.request_throughput,
                                 "p50_latency_ms": measured.p50_latency_ms})  # fmt: skip
                    print(label, index + 1, concurrency,
                          f"{measured.request_throughput:.1f} req/s", flush=True)  # fmt: skip
            finally:
                stop_group(process)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(args.model),
        "input_len": args.input_len,
        "rows": rows,
    }


def render(report: dict[str, Any]) -> str:
    """Per configuration and concurrency: the mean and the range of the rounds; and the
    plan against the defaults round by round."""
    rows = report["rows"]
    lines = ["| config | c | mean req/s | lowest-highest |", "|---|---|---|---|"]
    by: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        by.setdefault((row["config"], row["concurrency"]), []).append(row["request_throughput"])
    for (label, c), values in sorted(by.items()):
        lines.append(f"| {label} | {c} | {statistics.mean(values):.1f} | "
                     f"{min(values):.1f}-{max(values):.1f} |")  # fmt: skip
    for c in sorted({row["concurrency"] for row in rows}):
        pick = {(r["config"], r["round"]): r["request_throughput"] for r in rows
                if r["concurrency"] == c}  # fmt: skip
        rounds = sorted({r["round"] for r in rows})
        diffs = [100 * (pick["planned", i] / pick["defaults", i] - 1) for i in rounds]
        higher = sum(d > 0 for d in diffs)
        lines.append(f"\nc={c}: planned vs defaults per round "
                     f"{', '.join(f'{d:+.0f} %' for d in diffs)}; higher in {higher} of "
                     f"{len(diffs)}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=128)
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
