"""Benchmark: the planned endpoint against vLLM's own defaults, side by side, in one run.

Run:  .venv/bin/python benchmarks/serving.py [--models tiny small] [--concurrency 1 8 32]
      .venv/bin/python benchmarks/serving.py --render RESULT.json   # reprint a saved run
(needs tests/bootstrap.sh: the vLLM CPU venv; loopback only, no network; about 40 minutes
on 2 cores. Not a CI pass/fail: the figures go to benchmarks/serving-results.md.)

For each model (the tiny test model, and a ~100M-parameter model of the same recipe so that
matrix work shows; both built offline by tests/tools/tiny_model.py), one after the other:

- **planned**: the real `epycctl approve NAME --yes --no-start` (planner, host detection,
  model inspection, vLLM probe), then what the approved unit runs: its ExecCondition and its
  ExecStart (the supervisor and `vllm serve`) under the unit's CPUAffinity/NUMA bind (here
  numactl), with a NOTIFY_SOCKET standing in for systemd; measured once READY=1 arrived;
- **plain default**: `vllm serve MODEL`, nothing else; a refusal to start is a result;
- **plain + plan KV**: `vllm serve MODEL` with the plan's KV size, passed as the plan passes it;
- **plan, vLLM auto bind**: the plan's sizing and arguments, `VLLM_CPU_OMP_THREADS_BIND=auto`
  and no pin: vLLM chooses the cores (it reserves one per instance for its front end).

Optional (`--instances N`, not in a default run): the same model approved with
`instances = N` (docs/instances.md), each instance run as its unit runs it (supervisor,
pin) and Debian's HAProxy (tests/tools/haproxy.sh) in front with the plan's configuration,
against the 1-instance planned endpoint, both at `--instances-concurrency` (default 8).
Figures go to benchmarks/instances-results.md.

Each configuration: start-up (spawn to the first /health 200), then `vllm bench serve`
(random dataset, seed 0, --ignore-eos, max(32, 8 x concurrency) prompts, 8x that for the
tiny model, after as many warm-ups as the concurrency) at each concurrency, and the peak
RSS of the server's processes (summed, sampled every 0.5 s over start-up and benchmark;
the planned endpoint's supervisor process is left out, it is not vLLM's). Wherever the
planned endpoint's output tok/s falls below the best other configuration's, both are
measured once more at the end and the rerun pair decides (the machine is shared: the
1-minute load average is recorded).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runs import fmt, new_report, parse_run, run_parser  # noqa: E402

from epycd.approval.record import load_approval  # noqa: E402
from epycd.engines.vllm.plan.model import VllmCpuServer  # noqa: E402
from epycd.engines.vllm.render.commands import vllm_serve_on_host  # noqa: E402
from epycd.plan.endpoint import EndpointDecisions, Plan  # noqa: E402
from epycd.render.balancer import haproxy_config  # noqa: E402
from epycd.render.commands import supervisor  # noqa: E402
from epycd.settings import Settings  # noqa: E402
from tests.health.notifysock import NotifySocket  # noqa: E402
from tests.health.realvllm import CACHE, VENV, free_port, tiny_model_builder  # noqa: E402

EPYCD_DIRS = ("config", "state", "run", "unit", "quadlet")
EXCEPTION_LINE = re.compile(r"(^|\s)(ValueError|RuntimeError|MemoryError|OSError): ")
START_TIMEOUT_S = 900.0
BENCH_TIMEOUT_S = 1800.0
METRICS = ("completed", "output_throughput", "mean_ttft_ms", "mean_tpot_ms")
PLANNED = "planned"
DIAGNOSTIC = "plan, pinned, no supervisor"
"""The planned server without the product's supervisor: what the supervisor itself costs."""


def load1() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass
class Config:
    """One way of serving the model; `decisions` set means it runs under the supervisor,
    as the unit of that one vLLM process runs it."""

    label: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    pin: list[str] = field(default_factory=list)
    served: str = ""
    decisions: VllmCpuServer | None = None


@dataclass
class Measured:
    model: str
    label: str
    started: bool
    startup_s: float | None = None
    ready_s: float | None = None
    peak_rss_gib: float | None = None
    peak_pss_gib: float | None = None
    pss_by_process: dict[str, float] = field(default_factory=dict)
    log: str = ""
    load_at_start: float | None = None
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    refusal: str = ""
    rerun: bool = False


def process_title(process: psutil.Process) -> str:
    """vLLM's title of a server process (`VLLM::EngineCore` -> EngineCore; the `vllm serve`
    process is the APIServer), else its command name."""
    argv = process.cmdline()
    if argv and argv[0].startswith("VLLM::"):
        return argv[0].split("::", 1)[1].split()[0]
    if any(arg.endswith("vllm") for arg in argv[:2]) and "serve" in argv:
        return "APIServer"
    return str(process.name())


class PeakRss:
    """The peaks of a process tree's summed RSS and summed PSS, sampled in a thread, and
    each process's PSS at the PSS peak. RSS counts a page shared by the tree's processes
    (torch, Python, the tokenizer) once per process; PSS divides it among them, so the PSS
    sum is what the node holds for the tree (benchmarks/memory-results.md)."""

    def __init__(self, root: int, skip_root: bool) -> None:
        self.root, self.skip_root = root, skip_root
        self.peak = 0
        self.peak_pss = 0
        self.pss_at_peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> tuple[int, dict[str, int]]:
        try:
            root = psutil.Process(self.root)
            tree = root.children(recursive=True) + ([] if self.skip_root else [root])
        except psutil.Error:
            return 0, {}
        rss, pss = 0, dict[str, int]()
        for process in tree:
            with contextlib.suppress(psutil.Error):
                memory = process.memory_full_info()
                rss += memory.rss
                title = process_title(process)
                pss[title] = pss.get(title, 0) + memory.pss
        return rss, pss

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            rss, pss = self._sample()
            self.peak = max(self.peak, rss)
            if sum(pss.values()) > self.peak_pss:
                self.peak_pss, self.pss_at_peak = sum(pss.values()), pss

    def stop(self) -> float:
        """The peak RSS sum, GiB."""
        self._stop.set()
        self._thread.join()
        return round(self.peak / 2**30, 2)

    def pss(self) -> tuple[float, dict[str, float]]:
        """The peak PSS sum and each process's share of it, GiB."""
        by_title = {title: round(v / 2**30, 3) for title, v in sorted(self.pss_at_peak.items())}
        return round(self.peak_pss / 2**30, 3), by_title


class Bench:
    def __init__(self, work: Path, input_len: int, output_len: int) -> None:
        self.work = work
        self.input_len = input_len
        self.output_len = output_len
        self.vllm = VENV / "bin" / "vllm"
        for name in ("cache", "tmp", "results", "logs"):
            (work / name).mkdir(exist_ok=True)

    def server_env(self, extra: dict[str, str], cache: Path | None = None) -> dict[str, str]:
        """The caller's environment without any vLLM tuning; caches in `cache`, empty for
        each server so that every configuration pays the same cold compile at start-up."""
        cache = cache or self.work / "cache"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "EPYCD_"))}
        return base | {
            "VLLM_CACHE_ROOT": str(cache),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TMPDIR": str(self.work / "tmp"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            **extra,
        }

    @staticmethod
    def prompt_scale(model: Path) -> int:
        """The tiny model answers 128 tokens in milliseconds: 8x the prompts, so that a
        measurement lasts tens of seconds rather than 2-3 s of scheduler noise."""
        return 8 if "tiny" in model.name else 1

    def log_path(self, model: str, config: Config) -> Path:
        slug = re.sub(r"[^A-Za-z0-9.=-]+", "_", f"{model}-{config.label}")
        return Path(tempfile.mkstemp(prefix=f"{slug}-", suffix=".log", dir=self.work / "logs")[1])

    def spawn(self, config: Config, port: int, log: Path, notify: Path) -> subprocess.Popen[bytes]:
        if config.decisions is not None:
            server = vllm_serve_on_host(config.decisions)
            argv = [*config.pin, *supervisor(config.decisions, server)]
            extra = dict(config.env) | {"NOTIFY_SOCKET": str(notify)}
        else:
            argv = [*config.pin, str(self.vllm), "serve", *config.args, "--port", str(port)]
            extra = dict(config.env)
        cache = Path(tempfile.mkdtemp(prefix="cache-", dir=self.work / "cache"))
        with log.open("wb") as out:
            return subprocess.Popen(
                argv,
                env=self.server_env(extra, cache),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def bench(self, port: int, config: Config, model: Path, concurrency: int) -> dict[str, Any]:
        name = f"{model.name}-{config.label}-c{concurrency}.json".replace(" ", "_")
        prompts = max(32, 8 * concurrency) * self.prompt_scale(model)
        argv = [
            *(str(self.vllm), "bench", "serve", "--backend", "vllm"),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--model", config.served, "--tokenizer", str(model)),
            *("--dataset-name", "random", "--random-input-len", str(self.input_len)),
            *("--random-output-len", str(self.output_len), "--ignore-eos"),
            *("--num-prompts", str(prompts), "--max-concurrency", str(concurrency)),
            *("--seed", "0", "--num-warmups", str(concurrency), "--disable-tqdm"),
            "--save-result",
            *("--result-dir", str(self.work / "results"), "--result-filename", name),
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
        return {key: data.get(key) for key in METRICS} | {"prompts": prompts, "load": load}

    def measure(self, model: Path, tag: str, config: Config, concurrencies: list[int]) -> Measured:
        port = config.decisions.port if config.decisions is not None else free_port()
        log = self.log_path(tag, config)
        result = Measured(tag, config.label, False, load_at_start=load1(), log=str(log))
        with NotifySocket(self.work / f"notify-{os.getpid()}") as sock:
            t0 = time.monotonic()
            process = self.spawn(config, port, log, sock.path)
            rss = PeakRss(process.pid, skip_root=config.decisions is not None)
            try:
                if not wait_healthy(port, process):
                    result.refusal = refusal_line(log)
                    return result
                result.started, result.startup_s = True, round(time.monotonic() - t0, 1)
                if config.decisions is not None:
                    if sock.wait_for("READY=1", config.decisions.start_timeout_s) is None:
                        result.started, result.refusal = False, f"no READY=1: see {log}"
                        return result
                    result.ready_s = round(time.monotonic() - t0, 1)
                for concurrency in concurrencies:
                    run = self.bench(port, config, model, concurrency)
                    result.runs[concurrency] = run
                    print(f"  {tag} {config.label} c={concurrency}: {run}", flush=True)
                return result
            finally:
                stop_group(process)
                result.peak_rss_gib = rss.stop()
                result.peak_pss_gib, result.pss_by_process = rss.pss()


def plan_here(
    work: Path,
    endpoint_toml: str,
    *,
    host_usr: bool = False,
    engine_settings: dict[str, Any] | None = None,
) -> Plan:
    """The planner's plan of one endpoint file (`endpoint_toml`, as bench.toml) on this
    machine: `plan_all` against its own topology, under an EPYC identity where the product
    would refuse the CPU (with this host's /usr in it where `host_usr`, so the plan finds the
    host's compiler as it would on the host itself); `engine_settings`: the engines' own
    settings (runtimes, the converted folder). Exits with the refusal."""
    from epycd.host.detect import detect_host
    from epycd.plan.pipeline.build import PlanSources, plan_all
    from epycd.render import render_for_plan
    from epycd.settings import settings_model
    from tests.machine import serving_root

    config_dir = work / "planned-config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "bench.toml").write_text(endpoint_toml)
    root = serving_root(work)
    if host_usr and root != Path("/") and not (root / "usr").exists():
        (root / "usr").symlink_to("/usr")
    settings = settings_model()(
        config_dir=config_dir,
        state_dir=work / "state",
        run_dir=work / "run",
        unit_dir=work / "units",
        quadlet_dir=work / "quadlet",
        host_root=root,
        **(engine_settings or {}),
    )
    [result] = plan_all(settings, detect_host(root), render=render_for_plan,
                        sources=PlanSources(listeners={}, environ={}))  # fmt: skip
    if result.plan is None:
        raise SystemExit("the planner refused: " + "; ".join(p.text for p in result.errors))
    return result.plan


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
            time.sleep(0.25)
    return False


def refusal_line(log: Path) -> str:
    """The server's own reason: its first exception line."""
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


# --- the configurations -----------------------------------------------------------------


def epycd_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPYCD_")}
    for name in EPYCD_DIRS:
        (work / "epycd" / name).mkdir(parents=True, exist_ok=True)
        env[f"EPYCD_{name.upper()}_DIR"] = str(work / "epycd" / name)
    env["PYTHONPATH"] = str(REPO)
    return env


def approve(bench: Bench, name: str, model: Path, extra_toml: str = "") -> tuple[Plan, float]:
    """The real `epycctl approve NAME --yes --no-start`, then the unit's ExecCondition;
    `extra_toml`: more lines of the endpoint file."""
    env = epycd_env(bench.work / name)
    config_dir = Path(env["EPYCD_CONFIG_DIR"])
    (config_dir / f"{name}.toml").write_text(
        f'model = "{model}"\nruntime = "host"\nvllm = "{bench.vllm}"\nport = {free_port()}\n'
        + extra_toml
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "epycd", "approve", name, "--yes", "--no-start"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = round(time.monotonic() - t0, 2)
    if done.returncode != 0:
        raise SystemExit(f"approve failed:\n{done.stdout}\n{done.stderr}")
    settings = Settings.model_validate(
        {f"{d}_dir": env[f"EPYCD_{d.upper()}_DIR"] for d in EPYCD_DIRS}
    )
    approval = load_approval(settings, name)
    assert approval is not None
    plan = Plan.model_validate(approval.plan)
    for argv in plan.decisions.exec_condition:
        subprocess.run(argv, env=env, check=True, capture_output=True)
    return plan, seconds


def one_instance(plan: Plan) -> VllmCpuServer:
    """The decisions of an endpoint approved as one vLLM instance on CPUs."""
    decisions = plan.decisions
    server = decisions.first
    if decisions.instances is not None or not isinstance(server, VllmCpuServer):
        raise SystemExit(f"{plan.endpoint}: planned as {decisions.kind}, not one CPU instance")
    return server


def unit_pin(decisions: VllmCpuServer) -> list[str]:
    """What CPUAffinity= + NUMAPolicy=bind + NUMAMask= do to the unit's processes."""
    nodes = ",".join(map(str, decisions.numa_nodes))
    if shutil.which("numactl"):
        return ["numactl", f"--physcpubind={decisions.cpus}", f"--membind={nodes}"]
    return ["taskset", "-c", decisions.cpus]


def without_port(args: list[str]) -> list[str]:
    args = list(args)
    at = args.index("--port")
    del args[at : at + 2]
    return args


def plan_kv(decisions: VllmCpuServer) -> tuple[list[str], dict[str, str]]:
    """The plan's KV size, passed the way the plan passes it to this vLLM."""
    if "--kv-cache-memory-bytes" in decisions.vllm_args:
        at = decisions.vllm_args.index("--kv-cache-memory-bytes")
        return decisions.vllm_args[at : at + 2], {}
    return [], {"VLLM_CPU_KVCACHE_SPACE": decisions.env["VLLM_CPU_KVCACHE_SPACE"]}


def configs(model: Path, decisions: VllmCpuServer) -> list[Config]:
    served = str(model)
    kv_args, kv_env = plan_kv(decisions)
    auto_env = dict(decisions.env) | {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    return [
        Config(PLANNED, [], env=dict(decisions.env), pin=unit_pin(decisions), decisions=decisions),
        Config("plain default", [served], served=served),
        Config("plain + plan KV", [served, *kv_args], env=kv_env, served=served),
        Config(
            "plan, vLLM auto bind",
            without_port(decisions.vllm_args),
            env=auto_env,
            served=decisions.served_model_name,
        ),
        Config(
            DIAGNOSTIC,
            without_port(decisions.vllm_args),
            env=dict(decisions.env),
            pin=unit_pin(decisions),
            served=decisions.served_model_name,
        ),
    ]


# --- N instances behind HAProxy (optional) ----------------------------------------------

HAPROXY_ROOT = CACHE / "haproxy" / "root"


def instances_label(count: int) -> str:
    return f"planned, {count} instances + HAProxy"


def spawn_haproxy(bench: Bench, decisions: EndpointDecisions) -> subprocess.Popen[bytes]:
    """Debian's HAProxy from the test cache, in the foreground, with the plan's config."""
    config = bench.work / f"haproxy-{decisions.endpoint}.cfg"
    config.write_text(haproxy_config(decisions))
    binary = HAPROXY_ROOT / "usr" / "sbin" / "haproxy"
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"{binary} is missing: run tests/bootstrap.sh (tests/tools/haproxy.sh)")
    env = {"LD_LIBRARY_PATH": str(HAPROXY_ROOT / "usr" / "lib" / "x86_64-linux-gnu")}
    log = bench.work / "logs" / f"haproxy-{decisions.endpoint}.log"
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(binary), "-f", str(config)],
            env=os.environ | env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_members(
    bench: Bench, model: str, decisions: EndpointDecisions, stack: contextlib.ExitStack
) -> tuple[list[subprocess.Popen[bytes]], str]:
    """Every instance as its unit runs it, up to READY=1; (processes, refusal)."""
    processes = []
    for member in decisions.members:
        assert isinstance(member, VllmCpuServer), member.kind
        config = Config(member.unit_name, [], env=dict(member.env), pin=unit_pin(member),
                        decisions=member)  # fmt: skip
        sock = stack.enter_context(NotifySocket(bench.work / f"notify-{member.instance}"))
        log = bench.log_path(model, config)
        process = bench.spawn(config, member.port, log, sock.path)
        processes.append(process)
        stack.callback(stop_group, process)
        if not wait_healthy(member.port, process):
            return processes, f"instance {member.instance}: {refusal_line(log)}"
        if sock.wait_for("READY=1", member.start_timeout_s) is None:
            return processes, f"instance {member.instance}: no READY=1: see {log}"
    return processes, ""


def measure_instances(bench: Bench, size: str, count: int, concurrency: int) -> Measured:
    """The model approved with `instances = count`, every instance and the balancer up,
    then `vllm bench serve` against the balancer's port."""
    model = model_path(size)
    plan, _ = approve(bench, f"bench-{size}-x{count}", model, f"instances = {count}\n")
    decisions = plan.decisions
    if decisions.kind != "set":
        raise SystemExit(
            f"instances = {count} planned one instance here: {decisions.socket_reason}"
        )
    label = instances_label(count)
    result = Measured(size, label, False, load_at_start=load1())
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        processes, refusal = start_members(bench, size, decisions, stack)
        rss = [PeakRss(p.pid, skip_root=True) for p in processes]
        try:
            if refusal:
                result.refusal = refusal
                return result
            balancer = spawn_haproxy(bench, decisions)
            stack.callback(stop_group, balancer)
            if not wait_healthy(decisions.port, balancer):
                result.refusal = "HAProxy did not answer /health"
                return result
            result.started, result.startup_s = True, round(time.monotonic() - t0, 1)
            config = Config(label, [], served=decisions.served_model_name)
            result.runs[concurrency] = bench.bench(decisions.port, config, model, concurrency)
            print(f"  {size} {label} c={concurrency}: {result.runs[concurrency]}", flush=True)
            return result
        finally:
            result.peak_rss_gib = round(sum(r.stop() for r in rss), 2)


# --- the run ----------------------------------------------------------------------------


def machine() -> dict[str, str]:
    lscpu = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            lscpu[key.strip()] = value.strip()
    node = {}
    for line in Path("/sys/devices/system/node/node0/meminfo").read_text().splitlines():
        parts = line.split()
        node[parts[2].rstrip(":")] = int(parts[3]) / 2**20
    meminfo = {
        line.split(":")[0]: int(line.split()[1]) / 2**20
        for line in Path("/proc/meminfo").read_text().splitlines()
    }
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


def model_path(size: str) -> Path:
    """Built once under the test cache, apart from the tests' own tiny model."""
    builder = tiny_model_builder()
    return Path(builder.cached(CACHE / f"bench-{size}-model", builder.SHAPES[size]))


def best_other(measured: list[Measured], model: str, concurrency: int) -> Measured | None:
    """The fastest configuration other than the planned one, at this concurrency."""
    rivals = [
        m
        for m in measured
        if m.model == model
        and m.label not in (PLANNED, DIAGNOSTIC)
        and m.started
        and not m.rerun
        and "output_throughput" in m.runs.get(concurrency, {})
    ]
    return max(rivals, key=lambda m: m.runs[concurrency]["output_throughput"], default=None)


def output_tps(measured: list[Measured], model: str, label: str, c: int, rerun: bool) -> float:
    for m in measured:
        if (m.model, m.label, m.rerun) == (model, label, rerun) and m.started:
            return float(m.runs.get(c, {}).get("output_throughput") or 0.0)
    return 0.0


def losses(measured: list[Measured], model: str, concurrencies: list[int]) -> dict[str, list[int]]:
    """Per rival label, the concurrencies where planned served fewer tokens/s than it."""
    lost: dict[str, list[int]] = {}
    for c in concurrencies:
        rival = best_other(measured, model, c)
        if rival and output_tps(measured, model, PLANNED, c, False) < output_tps(
            measured, model, rival.label, c, False
        ):
            lost.setdefault(rival.label, []).append(c)
    return lost


def run_model(
    bench: Bench, size: str, concurrencies: list[int], labels: list[str]
) -> tuple[dict[str, Any], list[Measured]]:
    model = model_path(size)
    plan, approve_s = approve(bench, f"bench-{size}", model)
    decisions = one_instance(plan)
    print(f"{size}: approved in {approve_s} s: {decisions.vllm_args} {decisions.env}", flush=True)
    measured = []
    by_label = {config.label: config for config in configs(model, decisions)}
    for label in labels:
        config = by_label[label]
        result = bench.measure(model, size, config, concurrencies)
        print(f"{size} {config.label}: started={result.started} {result.refusal}", flush=True)
        measured.append(result)
    for label, lost in losses(measured, size, concurrencies).items():
        for again in (PLANNED, label):
            print(f"{size}: rerun {again} at {lost}", flush=True)
            result = bench.measure(model, size, by_label[again], lost)
            result.rerun = True
            measured.append(result)
    dumped = decisions.model_dump(mode="json")
    keys = ("cpus", "omp_cpus", "numa_nodes", "env", "vllm_args", "kv_cache_gb", "max_num_seqs")
    summary = {key: dumped[key] for key in keys} | {"approve_s": approve_s}
    return summary | {"model": str(model), "parameters": parameters(model)}, measured


def parameters(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    builder = tiny_model_builder()
    shape = builder.Shape(
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
    )
    return int(shape.parameters())


def main() -> None:
    parser = run_parser(__doc__, Path("/tmp/epyc-serving-results.json"))
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--configs",
        nargs="+",
        default=[PLANNED, "plain default", "plain + plan KV", "plan, vLLM auto bind"],
        help=f"which configurations (also: {DIAGNOSTIC!r})",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=0,
        help="also N instances behind HAProxy against 1 (docs/instances.md); 0: not run",
    )
    parser.add_argument("--instances-concurrency", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    args = parse_run(parser, render_markdown)
    if args is None:
        return
    work = Path(tempfile.mkdtemp(prefix="epyc-serving-"))
    settings = vars(args) | {"out": str(args.out), "render": None}
    report = new_report(machine(), settings, plans={}, served=[])
    print(json.dumps(report["machine"], indent=1), flush=True)
    bench = Bench(work, args.input_len, args.output_len)
    try:
        for size in args.models:
            plan, measured = run_model(bench, size, args.concurrency, args.configs)
            if args.instances > 1:
                measured.append(
                    measure_instances(bench, size, args.instances, args.instances_concurrency)
                )
            report["plans"][size] = plan
            report["served"] += [asdict(m) for m in measured]
            args.out.write_text(json.dumps(report, indent=1) + "\n")
        report["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    print(render_markdown(json.loads(args.out.read_text())))


# --- the tables -------------------------------------------------------------------------


def served_rows(served: list[dict[str, Any]], model: str) -> list[str]:
    rows = [
        "| configuration | start-up to /health (s) | peak RSS (GiB) | concurrency | "
        "output tok/s | mean TTFT (ms) | mean TPOT (ms) | load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for item in (i for i in served if i["model"] == model):
        label = item["label"] + (" (rerun)" if item["rerun"] else "")
        if not item["started"]:
            rows.append(
                f"| {label} | **did not start**: {item['refusal']} | "
                f"{fmt(item['peak_rss_gib'], 2)} | | | | | {fmt(item['load_at_start'], 2)} |"
            )
            continue
        for concurrency, run in sorted(item["runs"].items(), key=lambda kv: int(kv[0])):
            head = f"| {label} | {fmt(item['startup_s'])} | {fmt(item['peak_rss_gib'], 2)} |"
            if "error" in run:
                rows.append(f"{head} {concurrency} | error: {run['error']} | | | {run['load']} |")
                continue
            rows.append(
                f"{head} {concurrency} | {fmt(run['output_throughput'])} | "
                f"{fmt(run['mean_ttft_ms'])} | {fmt(run['mean_tpot_ms'], 2)} | "
                f"{fmt(run['load'], 2)} |"
            )
    return rows


def tps(served: list[dict[str, Any]], model: str, label: str, c: int, rerun: bool) -> float | None:
    for item in served:
        if (item["model"], item["label"], item["rerun"]) == (model, label, rerun):
            run = item["runs"].get(str(c)) or item["runs"].get(c) or {}
            return run.get("output_throughput")
    return None


def verdict_rows(report: dict[str, Any], model: str) -> list[str]:
    """Planned over the best other configuration that started, per concurrency."""
    served = report["served"]
    rows = [
        "| concurrency | best other | planned / best other (first run) | rerun pair |",
        "|---|---|---|---|",
    ]
    others = [i for i in served if i["model"] == model and i["label"] not in (PLANNED, DIAGNOSTIC)]
    for c in report["settings"]["concurrency"]:
        firsts = [
            (tps(served, model, i["label"], c, False) or 0.0, i["label"])
            for i in others
            if not i["rerun"] and i["started"]
        ]
        if not firsts:
            rows.append(f"| {c} | none started | - | - |")
            continue
        best, label = max(firsts)
        planned = tps(served, model, PLANNED, c, False)
        first = f"{planned / best:.2f}" if planned and best else "-"
        again_planned = tps(served, model, PLANNED, c, True)
        again_other = tps(served, model, label, c, True)
        rerun = f"{again_planned / again_other:.2f}" if again_planned and again_other else "-"
        rows.append(f"| {c} | {label} | {first} | {rerun} |")
    return rows


def render_markdown(report: dict[str, Any]) -> str:
    machine_info = report["machine"]
    settings = report["settings"]
    lines = [
        "## Figures (written by benchmarks/serving.py)",
        "",
        f"Run {report['started']} to {report.get('finished', '?')} UTC.",
        "",
        f"- CPU: {machine_info['cpu']}",
        f"- Memory: {machine_info['memory']}",
        f"- vLLM / torch: {machine_info['vllm_torch']}; kernel {machine_info['kernel']}",
        f"- `vllm bench serve`: random dataset, input {settings['input_len']} / output "
        f"{settings['output_len']} tokens, seed 0, --ignore-eos, max(32, 8 x concurrency) "
        "prompts (8x that for the tiny model) after as many warm-up requests as the "
        "concurrency, loopback",
        "",
    ]
    for model, plan in report["plans"].items():
        lines += [
            f"### {model} model ({plan['parameters'] / 1e6:.1f}M parameters)",
            "",
            f"The plan: CPUs {plan['cpus']}, OpenMP bind {plan['omp_cpus']}, NUMA nodes "
            f"{plan['numa_nodes']}, env `{plan['env']}`, `vllm serve "
            f"{' '.join(plan['vllm_args'])}` (approve took {plan['approve_s']} s).",
            "",
            *served_rows(report["served"], model),
            "",
            *verdict_rows(report, model),
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
