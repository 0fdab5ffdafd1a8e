"""vLLM's boot check (`BOOT_CHECK`, `epycd.approval.engine_check`): a host vLLM approved
compiled (its args without --enforce-eager) whose compile step lost a prerequisite since,
the C++ compiler or the serving interpreter's Python.h (docs/tuning.md rule 4)."""

from __future__ import annotations

from pathlib import Path

from epycd.approval.engine_check import EngineBootCheck
from epycd.engines.vllm.plan.model import vllm_processes
from epycd.engines.vllm.plan.tuning import compile_gap
from epycd.host.facts import HostFacts
from epycd.host.pyheaders import python_headers
from epycd.plan.endpoint import Plan


class VllmBootCheck(EngineBootCheck):
    def problems(self, plan: Plan, host: HostFacts, root: Path) -> list[str]:
        problem = compile_problem(plan, host, root)
        return [] if problem is None else [problem]


def compile_problem(plan: Plan, host: HostFacts, root: Path) -> str | None:
    """A host vLLM approved compiled (its args without --enforce-eager) whose compile step
    lost a prerequisite since: the C++ compiler, or the serving interpreter's Python.h.
    An eager or a container endpoint needs neither: eager is the invocation's (the plan's
    rule 4, or --enforce-eager in the endpoint file's words); a record from before the typed
    invocation says it in `enforce_eager` or, for the file's flag, in its words only. A set
    runs eager when every instance does."""
    eager = all(process.runs_eager for process in vllm_processes(plan.decisions))
    if plan.decisions.runtime != "host" or plan.decisions.vllm_executable is None or eager:
        return None
    gap = compile_gap(host.cxx_compiler, python_headers(root, plan.decisions.vllm_executable))
    if gap is None:
        return None
    return (
        "compile prerequisite gone since approval (approved compiled, without "
        f"--enforce-eager): {gap.what}: {gap.fix}, or approve again to run eager"
    )


BOOT_CHECK = VllmBootCheck()
