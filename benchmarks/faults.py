"""Benchmark: endpoints that heal, measured under real systemd (docs/healing.md).

Run:  .venv/bin/python benchmarks/faults.py [--out benchmarks/faults-run1.json]
      .venv/bin/python benchmarks/faults.py --render benchmarks/faults-run1.json
(needs tests/bootstrap.sh: the rootfs, the vLLM CPU venv, the tiny model, HAProxy's .debs.)

It runs the fault end-to-end tests (real systemd as PID 1 in systemd-nspawn, the real CPU vLLM
serving the tiny model) and keeps their machines' records (under /var/tmp/epyc-faults-*, the
machines' root folders removed), then reads from them:

- kill -9 of `vllm serve` of a ready endpoint, SIGSTOP of every vLLM process, kill -9 of
  vLLM's EngineCore and of its worker, and the kernel's OOM kill of the EngineCore over a
  memory cgroup's limit: the time to ready again against the start-up it had
  (tests/e2e/test_e2e.py, boot "reboot");
- kill -9 and SIGSTOP of llama-server (tests/e2e/test_llama.py, boot "reboot"), and SIGSTOP of
  one instance of a set, vLLM's (tests/e2e/test_instances.py) and llama.cpp's (test_llama.py);
- broken weights: the runs before the crash-loop state and the time to it; the runs at the
  next boot (tests/e2e/test_e2e.py, boots "stopped-reboot" and "crashloop-reboot");
- one of two instances SIGKILLed under 8 clients of steady load: failed requests, the time to
  degraded and back to ready, tok/s before, while degraded and after
  (tests/e2e/test_instances.py).

The pass/fail of each is the test's own; this script reports the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from daemon import machine  # noqa: E402
from runs import new_report, parse_run  # noqa: E402

from tests.e2e.faultfigures import engine_fault, loaded_kill  # noqa: E402

TESTS = [
    "tests/e2e/test_e2e.py::test_a_dead_or_hung_engine_is_restarted_with_no_action",
    "tests/e2e/test_e2e.py::test_an_engine_process_that_dies_inside_is_restarted",
    "tests/e2e/test_e2e.py::test_broken_weights_end_in_a_crash_loop_that_survives_a_reboot",
    "tests/e2e/test_instances.py::test_a_killed_instance_comes_back_by_itself_under_load",
    "tests/e2e/test_instances.py::test_a_hung_instance_comes_back_by_itself",
    "tests/e2e/test_llama.py::test_a_dead_or_hung_llama_server_is_back_with_no_action",
    "tests/e2e/test_llama.py::test_a_hung_llama_server_of_the_set_comes_back_by_itself",
]
ENGINE_FAULTS = {
    # (machine folder, boot, check): the row's name
    ("e2e0", "reboot", "kill_engine"): "vLLM: kill -9 of vllm serve",
    ("e2e0", "reboot", "stop_engine"): "vLLM: SIGSTOP of every process",
    ("e2e0", "reboot", "kill_engine_core"): "vLLM: kill -9 of the EngineCore",
    ("e2e0", "reboot", "kill_worker"): "vLLM: kill -9 of the worker",
    ("e2e0", "reboot", "oom_engine_core"): "vLLM: kernel OOM kill of the EngineCore",
    ("e2e-instances0", "reboot", "stop_instance"): "vLLM set: SIGSTOP of instance 1",
    ("e2e-llama0", "reboot", "kill_server"): "llama.cpp: kill -9 of llama-server",
    ("e2e-llama0", "reboot", "stop_server"): "llama.cpp: SIGSTOP of llama-server",
    ("e2e-llama0", "set", "set_stop_instance"): "llama.cpp set: SIGSTOP of instance 1",
}


def records(results: Path, phase: str) -> dict[str, dict[str, Any]]:
    """The last record of each check of one boot."""
    path = results / f"{phase}.jsonl"
    if not path.is_file():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {line["check"]: line for line in lines}


def started_servers(journal: dict[str, Any] | None) -> int | None:
    if journal is None:
        return None
    return sum(1 for e in journal["entries"] if "started server pid" in (e["message"] or ""))


def results_of(base: Path, folder: str) -> Path:
    """A machine's results folder under pytest's base folder (a pytest-xdist worker's own
    folder, popen-gwN, holds them when the suite runs on workers)."""
    found = sorted(base.glob(f"{folder}/results")) + sorted(base.glob(f"*/{folder}/results"))
    return found[0] if found else base / folder / "results"


def figures(base: Path) -> dict[str, Any]:
    host, pair = results_of(base, "e2e0"), results_of(base, "e2e-instances0")
    stopped, after = records(host, "stopped-reboot"), records(host, "crashloop-reboot")
    out: dict[str, Any] = {"engine_faults": {}}
    for (folder, phase, check), name in ENGINE_FAULTS.items():
        found = records(results_of(base, folder), phase).get(check)
        if found is not None:
            fault = engine_fault(found)
            out["engine_faults"][name] = fault.model_dump() | {"overhead_s": fault.overhead_s}
    if "crash_loop" in stopped:
        runs = started_servers(stopped.get("journal_crash_loop"))
        out["crash_loop"] = {
            "runs_on_broken_weights": runs,
            "seconds_to_crash_loop": stopped["crash_loop"]["seconds"],
            "state": stopped["crash_loop"]["ActiveState"],
            "runs_at_next_boot": started_servers(after.get("journal_unit")),
        }
    install = records(pair, "install")
    if "kill_under_load" in install:
        out["kill_under_load"] = loaded_kill(install["kill_under_load"]).model_dump()
    return out


def render(report: dict[str, Any]) -> str:
    found = report["figures"]
    lines = [f"Run of {report['started']} on {report['machine']['description']}", ""]
    lines += [
        "| fault | start-up before (s) | ready again after (s) | new run's start-up (s) "
        "| healing overhead (s) | restarts (NRestarts) |",
        "|---|---|---|---|---|---|",
    ]
    older = {found[c]["signal"]: found[c] for c in ("kill_engine", "stop_engine") if c in found}
    for name, fault in (found.get("engine_faults") or older).items():
        lines.append(
            f"| {name} | {fault['startup_before_s']} | {fault['to_ready_s']} "
            f"| {fault['startup_after_s']} | {fault['overhead_s']} | {fault['restarts']} |"
        )
    if loop := found.get("crash_loop"):
        lines += [
            "",
            f"Broken weights: {loop['runs_on_broken_weights']} runs, crash-loop after "
            f"{loop['seconds_to_crash_loop']} s; runs at the next boot: "
            f"{loop['runs_at_next_boot']}.",
        ]
    if kill := found.get("kill_under_load"):
        lines += [
            "",
            "| two instances, 8 clients | value |",
            "|---|---|",
            f"| requests / failed / failed in flight at the kill | {kill['requests']} / "
            f"{kill['failed']} / {kill['failed_in_flight']} |",
            f"| failed requests sent after the kill (s after it) | {kill['failed_after_kill']} |",
            f"| degraded after (s) / ready again after (s) | {kill['to_degraded_s']} / "
            f"{kill['to_ready_s']} |",
            f"| instance start-up before (s) | {kill['startup_before_s']} |",
        ]
        for window in ("before", "degraded", "after"):
            w = kill[window]
            rate = round(w["tokens"] / w["seconds"], 1) if w["seconds"] else "-"
            lines.append(
                f"| tok/s {window} ({w['seconds']} s, {w['requests']} requests) | {rate} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "faults-run.json")
    args = parse_run(parser, render)
    if args is None:
        return
    report = new_report({"description": machine()}, {"tests": TESTS})
    base = Path(tempfile.mkdtemp(prefix="epyc-faults-", dir="/var/tmp")) / "pytest"
    env = {**os.environ, "EPYC_E2E_KEEP": "1"}
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={base}"]
    done = subprocess.run([*pytest, *TESTS], cwd=REPO, env=env, check=False)
    for machine_copy in base.glob("*/rootfs"):
        shutil.rmtree(machine_copy, ignore_errors=True)
    report["pytest_exit"] = done.returncode
    report["records"] = str(base)
    report["figures"] = figures(base)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"the machines' records are kept in {base}")
    print(render(report))


if __name__ == "__main__":
    main()
