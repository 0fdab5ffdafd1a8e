"""Benchmark: the whole `epycctl detect --json --root <host>` process on a fake host of
2 sockets x 128 cores x 2 threads = 512 logical CPUs (NPS2). Target: under 0.3 s.

Run:  .venv/bin/python benchmarks/detect.py [--runs 30]
It writes the fake host (tests/hosts.py shape "bench-2s-512t") to a temporary folder, runs
the command `--runs` times after two warm-up runs, checks each output, and prints the
minimum, median, mean and maximum wall time, with the bare interpreter start and
`epycctl detect --json` on this machine (runtimes probed) for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hosts import CATALOGUE, make_host  # noqa: E402

TARGET_S = 0.3
SHAPE = "bench-2s-512t"


CPU_TIMES: list[float] = []
"""user + system CPU seconds of each timed child: steadier than wall time on a busy host."""


def timed(argv: list[str]) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_TIMES.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return elapsed, result.stdout


def summary(label: str, samples: list[float]) -> str:
    return (
        f"{label}: min {min(samples):.3f} s, median {statistics.median(samples):.3f} s, "
        f"mean {statistics.fmean(samples):.3f} s, max {max(samples):.3f} s ({len(samples)} runs)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    epycctl = str(Path(sys.executable).parent / "epycctl")
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        root = make_host(Path(tmp), SHAPE)
        shape = CATALOGUE[SHAPE]
        command = [epycctl, "detect", "--json", "--root", str(root)]
        for _ in range(2):
            timed(command)
        runs = []
        CPU_TIMES.clear()
        for _ in range(args.runs):
            elapsed, out = timed(command)
            facts = json.loads(out)
            assert facts["logical_cores"] == shape.logical_count == 512, facts["logical_cores"]
            runs.append(elapsed)
        cpu = list(CPU_TIMES)
        bare = [timed([python, "-c", "pass"])[0] for _ in range(10)]
        real = [timed([epycctl, "detect", "--json"])[0] for _ in range(10)]
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {os.getloadavg()}"
    )
    print(f"command: epycctl detect --json --root <{SHAPE}: 2 sockets, 512 threads>")
    print(summary("epycctl detect --json, wall", runs))
    print(summary("epycctl detect --json, CPU (user+sys)", cpu))
    print(summary("python -c pass", bare))
    print(summary("for scale, this machine (root /, podman+docker probed)", real))
    verdict = "meets" if statistics.median(runs) < TARGET_S else "misses"
    print(f"median {verdict} the {TARGET_S} s target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
