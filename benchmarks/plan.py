"""Benchmark: `epycctl plan` over 50 endpoint files on a 2-socket fake host (target < 1 s).

Run from the repository root:

    .venv/bin/python benchmarks/plan.py [--host genoa-9654-2s-nps4] [--endpoints 50] [--runs 5]
                                        [--write benchmarks/plan.results.md]

What is timed: the whole command as an admin runs it, `epycctl plan e00 --json --root ROOT`
in a fresh process (interpreter start, imports, host detection from the fake root, loading
and validating all endpoint files, model facts of a local model folder, allocation of every
endpoint, rendering and fingerprinting every plan), plus the in-process `plan_all` alone.

The fake host root comes from tests/hosts.py. This machine has podman 4.3 (no Quadlet) and
no docker daemon, so a `podman` on PATH that answers `podman version 5.4.2` stands for a
podman 5 host; everything else is the real code. The fake host's /proc/stat is static, and
with more endpoint files than sockets no load sample is taken (every socket is used).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hosts import make_host  # noqa: E402
from tests.plan.conftest import PODMAN_5, write_model  # noqa: E402


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {int(mem) / 1024**2:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )


def setup(work: Path, host: str, endpoints: int) -> tuple[Path, dict[str, str]]:
    root = make_host(work / "hosts", host)
    model = write_model(work / "models" / "qwen3-0.6b")
    config = work / "etc-epyc-llm"
    config.mkdir()
    for index in range(endpoints):
        extra = f"max_num_seqs = {1 + index % 4}\n" if index % 3 else ""
        (config / f"e{index:02d}.toml").write_text(f'model = "{model}"\n{extra}')
    shim = work / "bin"
    shim.mkdir()
    podman = shim / "podman"
    podman.write_text("#!/bin/sh\necho 'podman version 5.4.2'\n")
    podman.chmod(0o755)
    env = os.environ | {
        "EPYCD_CONFIG_DIR": str(config),
        "EPYCD_UNIT_DIR": str(work / "systemd"),
        "EPYCD_QUADLET_DIR": str(work / "containers-systemd"),
        "HF_HOME": str(work / "hf"),
        "PATH": f"{shim}:{os.environ['PATH']}",
    }
    return root, env


def time_cli(root: Path, env: dict[str, str], runs: int) -> tuple[list[float], dict[str, object]]:
    epycctl = Path(sys.executable).parent / "epycctl"
    argv = [str(epycctl), "plan", "e00", "--json", "--root", str(root)]
    times, last = [], {}
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"epycctl plan failed ({done.returncode}): {done.stderr}")
        last = json.loads(done.stdout)
    return times, last


IMPORTS = (
    "import epycd.cli, epycd.cli.plan, epycd.plan.pipeline.build, epycd.host.detect, epycd.render, "
    "epycd.model.check"
)


def time_imports(runs: int) -> list[float]:
    """A fresh interpreter importing what `epycctl plan` imports: the floor of the command."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", IMPORTS], check=True)
        times.append(time.perf_counter() - start)
    return times


def time_in_process(root: Path, env: dict[str, str], runs: int) -> tuple[list[float], list[int]]:
    os.environ.update(env)
    from epycd.host.detect import detect_host
    from epycd.host.facts import RuntimeFacts
    from epycd.plan.pipeline.build import PlanSources, plan_all
    from epycd.render import render_for_plan
    from epycd.settings import Settings

    settings = Settings()
    host = detect_host(root, probe_runtimes=False)
    host = host.model_copy(update={"runtimes": RuntimeFacts(podman=PODMAN_5)})
    times, codes = [], []
    for _ in range(runs):
        start = time.perf_counter()
        results = plan_all(
            settings, host, render=render_for_plan, sources=PlanSources(host_root=root)
        )
        times.append(time.perf_counter() - start)
        codes = [r.exit_code for r in results]
    return times, codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="genoa-9654-2s-nps4")
    parser.add_argument("--endpoints", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, env = setup(Path(tmp), args.host, args.endpoints)
        cli, shown = time_cli(root, env, args.runs)
        imports = time_imports(args.runs)
        inproc, codes = time_in_process(root, env, args.runs)
    planned = codes.count(0)
    lines = [
        f"## epycctl plan, {args.endpoints} endpoint files, fake host {args.host}",
        "",
        f"- machine: {machine()}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- endpoints planned: {planned}, refused (no socket/NUMA node left): "
        f"{codes.count(1)}, bad input: {codes.count(2)}",
        f"- e00: socket {shown.get('socket')}, NUMA nodes {shown.get('numa_nodes')}, "
        f"port {shown.get('port')}",
        f"- `epycctl plan e00 --json` (fresh process), {args.runs} runs: "
        f"median {statistics.median(cli):.3f} s, max {max(cli):.3f} s "
        f"({'under' if max(cli) < 1 else 'OVER'} the 1 s target)",
        f"- of which the imports alone (fresh interpreter): median "
        f"{statistics.median(imports):.3f} s",
        f"- in-process `plan_all` over all files, {args.runs} runs: "
        f"median {statistics.median(inproc):.3f} s, max {max(inproc):.3f} s "
        "(the first run imports the model stage)",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.write:
        with args.write.open("a") as out:
            out.write(report + "\n")


if __name__ == "__main__":
    main()
