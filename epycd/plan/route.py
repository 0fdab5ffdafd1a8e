"""What every engine's route shares (`EngineRoute`: what runs an endpoint's servers, as its
engine's planner chose it), the refusal of a host that is no EPYC (`refuse_non_epyc`) and
the container runtime `runtime = "auto"` picks (`container_runtime`). Each engine's route
subclasses `EngineRoute`: vLLM's is `epycd.engines.vllm.plan.route`, llama.cpp's is in its
`plan/model.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from epycd.errors import Refusal
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.plan.model import Runtime


class EngineRoute(BaseModel):
    """What runs an endpoint's servers, as its engine's planner chose it: each engine
    subclasses it. An endpoint refused after routing reports it (`plan --json`, the table)."""

    runtime: Runtime
    confirmation_reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def json_keys(self) -> dict[str, Any]:
        """Its `plan --json` keys (docs/architecture.md, "Plan keys")."""
        return {
            "runtime": self.runtime,
            "requires_confirmation": bool(self.confirmation_reasons),
            "confirmation_reasons": self.confirmation_reasons,
            "warnings": self.warnings,
        }

    def path_row(self) -> tuple[str, str]:
        """Its row in `epycctl plan`'s table."""
        return ("Path", self.runtime)


def refuse_non_epyc(host: HostFacts) -> None:
    if not host.is_amd_epyc:
        raise Refusal(
            f"not an AMD EPYC CPU: found {host.vendor} {host.cpu_model!r}",
            fix="epyc-llm serves on AMD EPYC hosts only; other x86 CPUs are out of scope",
        )


def container_runtime(runtimes: RuntimeFacts) -> Runtime | None:
    """The runtime precedence of `runtime = "auto"`, for the planner and quickstart alike:
    podman with Quadlet, else a docker whose daemon answers, else None (a host vLLM)."""
    if runtimes.podman.quadlet:
        return "podman"
    if runtimes.docker.daemon_reachable:
        return "docker"
    return None
