"""Benchmark: the memory the plan predicts for the server against what its process tree holds.

Run:  .venv/bin/python benchmarks/memory.py [--models tiny small] [--batched-tokens 2048 8192]
      .venv/bin/python benchmarks/memory.py --render RESULT.json   # reprint a saved run
(needs tests/bootstrap.sh: the vLLM CPU venv; loopback only; about 3 minutes per case on 2
cores. Not a CI pass/fail: the figures go to benchmarks/memory-results.md and, once judged,
to data/footprint/<vLLM version>.json.)

For each model (the tests' tiny model and the ~102M model of the same recipe, both built
offline by tests/tools/tiny_model.py) and each --max-num-batched-tokens given (default: the
plan's own), one after the other: the real `epycctl approve NAME --yes --no-start`, then what
the approved unit runs (ExecCondition, the supervisor and `vllm serve` under the unit's pin),
started and measured exactly as benchmarks/serving.py's "planned" configuration (its code,
imported): start-up, READY=1, then `vllm bench serve` at each concurrency, so the peak covers
loading, the compile/warm-up run, the KV pool and serving. Recorded per case: the plan's
`memory` (weights, KV pool, runtime, process_gb), the peak of the tree's summed PSS and its
split by process, the peak of the summed RSS, and the KV cache size vLLM logged (tokens x
the model's KV bytes per token, against the plan's pool).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runs import fmt, new_report, parse_run, run_parser
from serving import PLANNED, Bench, approve, configs, machine, model_path, one_instance, parameters

from epycd.engines.vllm.model.footprint import load_footprint
from epycd.sizes import GIB

KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def logged_kv_tokens(log: Path) -> int | None:
    """The tokens of vLLM's "CPU KV cache size: N tokens" line, None without one."""
    found = KV_LINE.search(log.read_text(errors="replace")) if log.is_file() else None
    return int(found.group(1).replace(",", "")) if found else None


def run_case(
    bench: Bench, size: str, batched: int | None, concurrency: list[int]
) -> dict[str, Any]:
    model = model_path(size)
    extra = f'extra_args = ["--max-num-batched-tokens={batched}"]\n' if batched else ""
    name = f"mem-{size}-{batched or 'plan'}"
    plan, _ = approve(bench, name, model, extra)
    decisions = one_instance(plan)
    config = next(c for c in configs(model, decisions) if c.label == PLANNED)
    measured = bench.measure(model, size, config, concurrency)
    tokens = logged_kv_tokens(Path(measured.log))
    memory = decisions.memory
    kv_logged = round(tokens * memory.kv_bytes_per_token / GIB, 3) if tokens else None
    case = {
        "model": size,
        "parameters": parameters(model),
        "batched_tokens": decisions.max_num_batched_tokens,
        "max_num_seqs": decisions.max_num_seqs,
        "memory": memory.model_dump(mode="json"),
        "started": measured.started,
        "refusal": measured.refusal,
        "startup_s": measured.startup_s,
        "peak_pss_gib": measured.peak_pss_gib,
        "peak_rss_gib": measured.peak_rss_gib,
        "pss_by_process": measured.pss_by_process,
        "kv_logged_tokens": tokens,
        "kv_logged_gib": kv_logged,
        "runs": measured.runs,
    }
    print(json.dumps(case), flush=True)
    return case


def main() -> None:
    parser = run_parser(__doc__, Path("/tmp/epyc-memory-results.json"))
    parser.add_argument(
        "--batched-tokens",
        type=int,
        nargs="+",
        default=[0],
        help="--max-num-batched-tokens per case, through extra_args (0: the plan's own)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8])
    args = parse_run(parser, render_markdown)
    if args is None:
        return
    work = Path(tempfile.mkdtemp(prefix="epyc-memory-"))
    settings = {"concurrency": args.concurrency, "batched_tokens": args.batched_tokens}
    report = new_report(machine(), settings, cases=[])
    bench = Bench(work, 128, 128)
    try:
        for size in args.models:
            for batched in args.batched_tokens:
                report["cases"].append(run_case(bench, size, batched or None, args.concurrency))
                args.out.write_text(json.dumps(report, indent=1) + "\n")
        report["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    print(render_markdown(report))


def off_by(predicted: float, measured: float | None) -> str:
    return "-" if not measured else f"{(predicted - measured) / measured:+.1%}"


def predicted_now(case: dict[str, Any], vllm_version: str) -> float:
    """process_gb with the data/footprint figures there are now (a run records the plan's
    prediction with the figures of its time)."""
    memory = case["memory"]
    footprint, _ = load_footprint(vllm_version)
    runtime = footprint.runtime_gib(memory["weights_gb"], case["batched_tokens"])
    return round(float(memory["weights_gb"]) + float(memory["kv_pool_gb"]) + runtime, 2)


def case_row(case: dict[str, Any], vllm_version: str) -> str:
    memory = case["memory"]
    now = predicted_now(case, vllm_version)
    return (
        f"| {case['model']} ({case['parameters'] / 1e6:.1f}M) | {case['batched_tokens']} | "
        f"{memory['weights_gb']} | {memory['kv_pool_gb']} | {fmt(case['kv_logged_gib'], 3)} | "
        f"{memory['runtime_gb']} | {memory['process_gb']} | **{now}** | "
        f"**{fmt(case['peak_pss_gib'], 2)}** | {off_by(now, case['peak_pss_gib'])} | "
        f"{fmt(case['peak_rss_gib'], 2)} | {off_by(now, case['peak_rss_gib'])} |"
    )


def runtime_row(case: dict[str, Any]) -> str:
    """Each process's PSS at the peak; the worker's without the weights and the KV pool."""
    memory = case["memory"]
    parts = dict(case["pss_by_process"])
    if "Worker" in parts:
        parts["Worker - weights - KV"] = round(
            parts["Worker"] - memory["weights_gb"] - memory["kv_pool_gb"], 3
        )
    shown = ", ".join(f"{title} {value:.3f}" for title, value in parts.items())
    return f"| {case['model']} | {case['batched_tokens']} | {shown} |"


def render_markdown(report: dict[str, Any]) -> str:
    info = report["machine"]
    version = info["vllm_torch"].split()[0]
    lines = [
        "## Figures (written by benchmarks/memory.py)",
        "",
        f"Run {report['started']} to {report.get('finished', '?')} UTC.",
        "",
        f"- CPU: {info['cpu']}",
        f"- Memory: {info['memory']}",
        f"- vLLM / torch: {info['vllm_torch']}; kernel {info['kernel']}",
        f"- `vllm bench serve` at concurrency {report['settings']['concurrency']}, random "
        "128/128 tokens, after READY=1",
        "",
        "GiB throughout. *KV logged*: vLLM's KV cache size line, tokens x KV bytes per token. "
        "*runtime*, *process_gb (run)*: the plan's at the time of the run; *process_gb (now)*: "
        "with data/footprint as it is now; *off*: (now - measured) / measured.",
        "",
        "| model | batched tokens | weights | KV pool | KV logged | runtime (run) | "
        "process_gb (run) | process_gb (now) | peak PSS sum | off | peak RSS sum | off (RSS) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(case_row(case, version) for case in report["cases"] if case["started"]),
        "",
        "PSS per process at the tree's PSS peak (GiB):",
        "",
        "| model | batched tokens | processes |",
        "|---|---|---|",
        *(runtime_row(case) for case in report["cases"] if case["started"]),
        "",
    ]
    refused = [c for c in report["cases"] if not c["started"]]
    lines += [f"- {c['model']} did not start: {c['refusal']}" for c in refused]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
