"""Benchmark: the planned endpoint against a plain `vllm serve`, on this host, in one run.

Run:  .venv/bin/python benchmarks/serving.py [--out benchmarks/serving-results.md]
(needs tests/bootstrap.sh: the vLLM CPU venv and the tiny model under $EPYC_TEST_CACHE;
loopback only, no network, a few minutes on 2 cores.)

What it measures, all with the tiny model (a Qwen-sized model cannot be fetched offline):

(b) approve -> ready: the real `epycctl approve NAME --yes --no-start` on a host-vLLM endpoint
    file (the real planner: host detection, model inspection, the vLLM probe), then what the
    approved unit would run: its ExecCondition (the approval check) and its ExecStart (the
    supervisor and `vllm serve`), under the unit's CPUAffinity/NUMAPolicy via numactl, with a
    NOTIFY_SOCKET standing in for systemd. The product's own cost is the time to READY=1
    minus vLLM's own start-up (the gate's `health` phase: spawn to the first /health 200).
(a) served throughput with `vllm bench serve` (random dataset, fixed seed, bounded prompts):
    the planned endpoint (the env, args and pin the planner produced) against a plain
    `vllm serve MODEL` with default settings; when plain refuses to start (vLLM's per-node
    memory rule), that is the recorded result and the closest plain configuration that
    starts is measured instead; then a sweep of VLLM_CPU_OMP_THREADS_BIND.
(c) readiness latency is benchmarks/readiness.py (results in readiness-results.md).

The machine is shared: the 1-minute load average is recorded next to each figure, and a
configuration measured at a load above --rerun-load is measured once more at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from epycd.approval.record import load_approval  # noqa: E402
from epycd.plan.model import Plan  # noqa: E402
from epycd.render.commands import supervisor, vllm_serve_on_host  # noqa: E402
from epycd.settings import Settings  # noqa: E402
from epycd.supervisor import read_status  # noqa: E402
from tests.health.notifysock import NotifySocket  # noqa: E402
from tests.health.realvllm import VENV, free_port, tiny_model  # noqa: E402

NAME = "bench"
EPYCD_DIRS = ("config", "state", "run", "unit", "quadlet")
EXCEPTION_LINE = re.compile(r"(^|\s)(ValueError|RuntimeError|MemoryError|OSError): ")
START_TIMEOUT_S = 900.0
BENCH_TIMEOUT_S = 900.0
PLAN_KEYS = (
    "cpus",
    "numa_nodes",
    "env",
    "vllm_args",
    "kv_cache_gb",
    "max_model_len",
    "max_num_seqs",
    "start_timeout_s",
)
METRICS = (
    "completed",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass
class Config:
    """One way of serving the same model."""

    label: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    pin: list[str] = field(default_factory=list)
    served: str = ""


@dataclass
class Measured:
    label: str
    started: bool
    startup_s: float | None = None
    load_at_start: float | None = None
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    refusal: str = ""
    rerun: bool = False


class Bench:
    def __init__(self, work: Path, prompts: int, input_len: int, output_len: int) -> None:
        self.work = work
        self.prompts = prompts
        self.input_len = input_len
        self.output_len = output_len
        self.model = tiny_model()
        self.vllm = VENV / "bin" / "vllm"
        for name in ("cache", "tmp", "results"):
            (work / name).mkdir(exist_ok=True)

    def server_env(self, extra: dict[str, str]) -> dict[str, str]:
        """The caller's environment without any vLLM tuning, caches in the work folder."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "EPYCD_"))}
        return base | {
            "VLLM_CACHE_ROOT": str(self.work / "cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.work / "cache" / "inductor"),
            "TMPDIR": str(self.work / "tmp"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            **extra,
        }

    def serve(self, config: Config, port: int) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.work / f"{config.label.replace(' ', '_').replace('/', '_')}.log"
        argv = [*config.pin, str(self.vllm), "serve", *config.args, "--port", str(port)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                env=self.server_env(config.env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return process, log

    def bench(self, port: int, served: str, concurrency: int, tag: str) -> dict[str, Any]:
        name = f"{tag}-c{concurrency}.json"
        argv = [
            str(self.vllm),
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            served,
            "--tokenizer",
            str(self.model),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(self.input_len),
            "--random-output-len",
            str(self.output_len),
            "--ignore-eos",
            "--num-prompts",
            str(self.prompts),
            "--max-concurrency",
            str(concurrency),
            "--seed",
            "0",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            str(self.work / "results"),
            "--result-filename",
            name,
        ]
        load = load1()
        done = subprocess.run(
            argv,
            env=self.server_env({}),
            capture_output=True,
            text=True,
            timeout=BENCH_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return {"error": " / ".join(tail), "load": load}
        data = json.loads((self.work / "results" / name).read_text())
        return {key: data.get(key) for key in METRICS} | {"load": load, "load_after": load1()}

    def measure(self, config: Config, concurrencies: list[int]) -> Measured:
        port = free_port()
        load = load1()
        started = time.monotonic()
        process, log = self.serve(config, port)
        try:
            if not wait_healthy(port, process):
                return Measured(config.label, False, load_at_start=load, refusal=refusal_line(log))
            result = Measured(
                config.label, True, round(time.monotonic() - started, 1), load_at_start=load
            )
            for concurrency in concurrencies:
                result.runs[concurrency] = self.bench(
                    port, config.served, concurrency, config.label
                )
                print(f"  {config.label} c={concurrency}: {result.runs[concurrency]}", flush=True)
            return result
        finally:
            stop_group(process)


def wait_healthy(port: int, process: subprocess.Popen[bytes]) -> bool:
    """True once /health answers 200; False when the server exited first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return True
            time.sleep(0.5)
    return False


def refusal_line(log: Path) -> str:
    """The server's own reason: its last error line."""
    lines = log.read_text(errors="replace").splitlines()
    root = [line.split("] ", 1)[-1] for line in lines if EXCEPTION_LINE.search(line)]
    return (root or lines or ["no output"])[0].strip()[:400]


def stop_group(process: subprocess.Popen[Any], timeout: float = 30) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def unit_pin(plan: Plan) -> list[str]:
    """What CPUAffinity= + NUMAPolicy=bind + NUMAMask= do to the unit's processes."""
    nodes = ",".join(map(str, plan.numa_nodes))
    if shutil.which("numactl"):
        return ["numactl", f"--physcpubind={plan.cpus}", f"--membind={nodes}"]
    return ["taskset", "-c", plan.cpus]


# --- (b) approve -> ready -------------------------------------------------------------


def epycd_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPYCD_")}
    for name in EPYCD_DIRS:
        (work / "epycd" / name).mkdir(parents=True, exist_ok=True)
        env[f"EPYCD_{name.upper()}_DIR"] = str(work / "epycd" / name)
    env["PYTHONPATH"] = str(REPO)
    return env


def approve_to_ready(bench: Bench) -> tuple[dict[str, Any], Plan, subprocess.Popen[bytes]]:
    """The timings of approve -> READY=1; the supervisor is left serving for (a)."""
    env = epycd_env(bench.work)
    config_dir = Path(env["EPYCD_CONFIG_DIR"])
    (config_dir / f"{NAME}.toml").write_text(
        f'model = "{bench.model}"\nruntime = "host"\nvllm = "{bench.vllm}"\n'
    )
    load = load1()
    t0 = time.monotonic()
    approve = subprocess.run(
        [sys.executable, "-m", "epycd", "approve", NAME, "--yes", "--no-start"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    t_approved = time.monotonic()
    if approve.returncode != 0:
        raise SystemExit(f"approve failed:\n{approve.stdout}\n{approve.stderr}")
    settings = Settings(
        config_dir=config_dir,
        state_dir=Path(env["EPYCD_STATE_DIR"]),
        run_dir=Path(env["EPYCD_RUN_DIR"]),
        unit_dir=Path(env["EPYCD_UNIT_DIR"]),
        quadlet_dir=Path(env["EPYCD_QUADLET_DIR"]),
    )
    approval = load_approval(settings, NAME)
    assert approval is not None
    plan = Plan.model_validate(approval.plan)
    for argv in plan.exec_condition:
        subprocess.run(argv, env=env, check=True, capture_output=True)
    t_checked = time.monotonic()
    assert plan.status_file is not None
    with NotifySocket(bench.work / "notify") as sock:
        server_env = bench.server_env(plan.env) | {"NOTIFY_SOCKET": str(sock.path)}
        log = (bench.work / "supervisor.log").open("wb")
        process = subprocess.Popen(
            [*unit_pin(plan), *supervisor(plan, vllm_serve_on_host(plan))],
            env=server_env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        t_spawned = time.monotonic()
        if sock.wait_for("READY=1", plan.start_timeout_s) is None:
            stop_group(process)
            raise SystemExit(f"no READY=1: see {bench.work / 'supervisor.log'}")
        t_ready = next(t for t, m in sock.messages if "READY=1" in m.split("\n"))
    status = read_status(Path(plan.status_file))
    assert status is not None
    gate = status.seconds
    total = t_ready - t0
    timings = {
        "load": load,
        "approve_cli_s": round(t_approved - t0, 2),
        "approval_check_s": round(t_checked - t_approved, 2),
        "spawn_s": round(t_spawned - t_checked, 3),
        "gate_s": gate,
        "approve_to_ready_s": round(total, 2),
        "vllm_startup_s": gate["health"],
        "product_overhead_s": round(total - gate["health"], 2),
        "after_health_s": round(t_ready - t_spawned - gate["health"], 3),
    }
    return timings, plan, process


# --- the run ----------------------------------------------------------------------------


def machine() -> dict[str, str]:
    lscpu = dict(
        (k.strip(), v.strip())
        for k, v in (
            line.split(":", 1)
            for line in subprocess.run(
                ["lscpu"], capture_output=True, text=True
            ).stdout.splitlines()
            if ":" in line
        )
    )
    node = {}
    for line in Path("/sys/devices/system/node/node0/meminfo").read_text().splitlines():
        parts = line.split()
        node[parts[2].rstrip(":")] = int(parts[3]) / 2**20
    meminfo = dict(
        (line.split(":")[0], int(line.split()[1]) / 2**20)
        for line in Path("/proc/meminfo").read_text().splitlines()
    )
    version = subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-c",
            "import vllm, torch; print(vllm.__version__, torch.__version__)",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "cpu": f"{lscpu.get('Model name')} (family {lscpu.get('CPU family')} model "
        f"{lscpu.get('Model')}), {lscpu.get('Socket(s)')} socket, {lscpu.get('CPU(s)')} CPUs, "
        f"{lscpu.get('Core(s) per socket')} cores/socket, {lscpu.get('Thread(s) per core')} "
        f"thread/core, NUMA nodes {lscpu.get('NUMA node(s)')}",
        "memory": f"/proc/meminfo MemTotal {meminfo['MemTotal']:.1f} GiB; node0 MemTotal "
        f"{node['MemTotal']:.1f} GiB, MemFree {node['MemFree']:.1f} GiB",
        "vllm_torch": version,
        "kernel": os.uname().release,
    }


def plain_configs(model: Path, plan: Plan) -> list[Config]:
    """Plain `vllm serve` with defaults, then the closest plain configurations."""
    served = str(model)
    return [
        Config("plain default", [served], served=served),
        Config(
            f"plain --max-model-len {plan.max_model_len}",
            [served, "--max-model-len", str(plan.max_model_len)],
            served=served,
        ),
        Config(
            f"plain + VLLM_CPU_KVCACHE_SPACE={plan.kv_cache_gb}",
            [served],
            env={"VLLM_CPU_KVCACHE_SPACE": str(plan.kv_cache_gb)},
            served=served,
        ),
    ]


def planned_config(plan: Plan, bind: str | None = None) -> Config:
    env = dict(plan.env)
    label = f"planned (bind {plan.cpus})"
    if bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        label = f"planned, bind {bind}"
    args = [a for a in plan.vllm_args]
    port_at = args.index("--port")
    del args[port_at : port_at + 2]
    return Config(label, args, env=env, pin=unit_pin(plan), served=plan.served_model_name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/epyc-serving-results.json"))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--binds", nargs="+", default=["0", "1"])
    parser.add_argument("--rerun-load", type=float, default=2.0)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--render", type=Path, help="only print the tables of a saved run")
    args = parser.parse_args()
    if args.render:
        print(render_markdown(json.loads(args.render.read_text())))
        return
    work = Path(tempfile.mkdtemp(prefix="epyc-serving-"))
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": vars(args) | {"out": str(args.out)},
    }
    print(json.dumps(report["machine"], indent=1), flush=True)
    bench = Bench(work, args.prompts, args.input_len, args.output_len)
    try:
        timings, plan, supervised = approve_to_ready(bench)
        report["approve_to_ready"] = timings
        dumped = plan.model_dump(mode="json")
        report["plan"] = {key: dumped[key] for key in PLAN_KEYS}
        print(f"(b) {timings}", flush=True)
        planned = Measured(
            f"planned (bind {plan.cpus})",
            True,
            timings["vllm_startup_s"],
            load_at_start=timings["load"],
        )
        try:
            for concurrency in args.concurrency:
                planned.runs[concurrency] = bench.bench(
                    plan.port, plan.served_model_name, concurrency, "planned"
                )
                print(f"  planned c={concurrency}: {planned.runs[concurrency]}", flush=True)
        finally:
            stop_group(supervised)
        measured = [planned]
        for config in plain_configs(bench.model, plan):
            result = bench.measure(config, args.concurrency)
            print(f"{config.label}: started={result.started} {result.refusal}", flush=True)
            measured.append(result)
            if result.started:
                break
        configs = {c.label: c for c in plain_configs(bench.model, plan)}
        for bind in args.binds:
            config = planned_config(plan, bind)
            configs[config.label] = config
            measured.append(bench.measure(config, args.concurrency))
        configs[planned.label] = planned_config(plan)
        busy = [m for m in measured if m.started and busy_run(m, args.rerun_load)]
        for old in busy:
            print(f"rerun (load was high): {old.label}", flush=True)
            again = bench.measure(configs[old.label], args.concurrency)
            again.rerun = True
            measured.append(again)
        report["served"] = [vars(m) for m in measured]
        if timings["load"] > args.rerun_load:
            print("rerun (load was high): approve -> ready", flush=True)
            timings_again, _, supervised = approve_to_ready(bench)
            stop_group(supervised)
            report["approve_to_ready_rerun"] = timings_again
            print(f"(b) rerun {timings_again}", flush=True)
        report["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    print(render_markdown(json.loads(args.out.read_text())))


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def served_rows(served: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| configuration | started | start-up to /health (s) | concurrency | requests/s | "
        "output tok/s | mean TTFT (ms) | mean TPOT (ms) | load (1 min) at bench |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for item in served:
        label = item["label"] + (" (rerun)" if item["rerun"] else "")
        if not item["started"]:
            refused = f"**no**: {item['refusal']}"
            load = fmt(item["load_at_start"], 2)
            rows.append(f"| {label} | {refused} | - | - | - | - | - | - | {load} |")
            continue
        for concurrency, run in sorted(item["runs"].items(), key=lambda kv: int(kv[0])):
            if "error" in run:
                rows.append(
                    f"| {label} | yes | {fmt(item['startup_s'])} | {concurrency} | "
                    f"error: {run['error']} | | | | {fmt(run['load'], 2)} |"
                )
                continue
            rows.append(
                f"| {label} | yes | {fmt(item['startup_s'])} | {concurrency} | "
                f"{fmt(run['request_throughput'], 2)} | {fmt(run['output_throughput'])} | "
                f"{fmt(run['mean_ttft_ms'])} | {fmt(run['mean_tpot_ms'], 2)} | "
                f"{fmt(run['load'], 2)} |"
            )
    return rows


def throughput(served: list[dict[str, Any]], label: str, rerun: bool) -> dict[str, float]:
    for item in served:
        if item["label"] == label and item["rerun"] == rerun and item["started"]:
            return {str(c): run.get("output_throughput") for c, run in item["runs"].items()}
    return {}


def ratio_rows(report: dict[str, Any]) -> list[str]:
    served = report["served"]
    concurrencies = report["settings"]["concurrency"]
    planned = served[0]["label"]
    started = [i["label"] for i in served if i["started"] and not i["rerun"]]
    plain = next((label for label in started if label.startswith("plain")), None)
    sweep = [label for label in started if label != planned and not label.startswith("plain")]
    header = " | ".join(f"concurrency {c}" for c in concurrencies)
    rows = [
        f"| ratio of output tok/s | measured | {header} |",
        "|---|---|" + "---|" * len(concurrencies),
    ]
    pairs = [(planned, plain)] if plain else []
    pairs += [(label, planned) for label in sweep]
    for top, bottom in pairs:
        for rerun in (False, True):
            a, b = throughput(served, top, rerun), throughput(served, bottom, rerun)
            if a and b:
                cells = " | ".join(ratio(a.get(str(c)), b.get(str(c))) for c in concurrencies)
                rows.append(f"| {top} / {bottom} | {'rerun' if rerun else 'first'} | {cells} |")
    return rows


def rerun_rows(again: dict[str, Any] | None) -> list[str]:
    if not again:
        return []
    return [
        f"Measured again at the end (the load was high): approve -> READY=1 "
        f"{again['approve_to_ready_s']} s, vLLM's own start-up {again['vllm_startup_s']} s, "
        f"**the product's own {again['product_overhead_s']} s** (approve CLI "
        f"{again['approve_cli_s']} s, approval check {again['approval_check_s']} s, READY=1 "
        f"{again['after_health_s']} s after /health 200), at a load of {again['load']}.",
        "",
    ]


def render_markdown(report: dict[str, Any]) -> str:
    b = report["approve_to_ready"]
    gate = b["gate_s"]
    check_s = b.get("approval_check_s", b.get("exec_start_pre_s"))
    machine_info = report["machine"]
    lines = [
        "## Figures (written by benchmarks/serving.py)",
        "",
        f"Run {report['started']} to {report.get('finished', '?')} UTC.",
        "",
        f"- CPU: {machine_info['cpu']}",
        f"- Memory: {machine_info['memory']}",
        f"- vLLM / torch: {machine_info['vllm_torch']} (tests/tools/vllm_venv.sh); kernel "
        f"{machine_info['kernel']}",
        f"- Settings: {report['settings']['prompts']} prompts per measurement, random dataset, "
        f"input {report['settings']['input_len']} / output {report['settings']['output_len']}"
        " tokens, seed 0, --ignore-eos, loopback",
        f"- The plan for this host: CPUs {report['plan']['cpus']}, NUMA nodes "
        f"{report['plan']['numa_nodes']}, env {report['plan']['env']}, args "
        f"`{' '.join(report['plan']['vllm_args'])}`",
        "",
        "### (b) approve -> ready, and vLLM's own start-up",
        "",
        "| step | seconds |",
        "|---|---|",
        f"| `epycctl approve bench --yes --no-start` (plan, probe the vLLM, write) | "
        f"{b['approve_cli_s']} |",
        f"| ExecCondition (the approval check) | {check_s} |",
        f"| spawn the supervisor (numactl pin) | {b['spawn_s']} |",
        f"| vLLM's own start-up: spawn -> first /health 200 (gate phase `health`) | "
        f"{gate['health']} |",
        f"| gate: /v1/models, then the smoke request (cumulative) | {gate['models']}, "
        f"{gate['request']} |",
        f"| READY=1 after /health 200 | {b['after_health_s']} |",
        f"| **approve -> READY=1** | **{b['approve_to_ready_s']}** |",
        f"| **minus vLLM's own start-up** | **{b['product_overhead_s']}** |",
        "",
        f"Load average (1 min) when it started: {b['load']}.",
        "",
        *rerun_rows(report.get("approve_to_ready_rerun")),
        "### (a) served throughput (`vllm bench serve`)",
        "",
        *served_rows(report["served"]),
        "",
        *ratio_rows(report),
        "",
    ]
    return "\n".join(lines)


def busy_run(measured: Measured, limit: float) -> bool:
    loads = [run.get("load") or 0.0 for run in measured.runs.values()]
    return any(load > limit for load in loads)


if __name__ == "__main__":
    main()
