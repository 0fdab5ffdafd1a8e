"""What each engine shows of its endpoints in `epycctl plan` (`PlanView`): its `plan --json`
keys beyond every endpoint's, and its rows of the confirmation table. One implementation per
engine (`epycd.engines.ENGINE.cli`), listed by `epycd.cli.engine_views`; `epycd.cli.plan`
asks it and never names an engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from epycd.plan.endpoint import EndpointDecisions
from epycd.plan.model import AnyServer

Row = tuple[str, str]
GPU_KEYS = ("gpus", "gfx_version", "tensor_parallel_size")
"""The plan keys of a GPU placement (null on CPUs)."""


def instances_json(decided: EndpointDecisions, words: str | None = None) -> dict[str, Any]:
    """A set's layout, its balancer, and each member as a whole instance (its own port,
    CPUs, nodes, env and, under the key `words`, its engine's words, made from its invocation
    as the renderer makes them)."""
    chosen = decided.instances
    assert chosen is not None, "a set's"
    return {
        "requested": chosen.requested,
        "placement": chosen.placement,
        "count": chosen.count,
        "min_ready": chosen.min_ready,
        "reasons": chosen.reasons,
        "balancer": {
            "kind": chosen.balancer,
            "unit_name": decided.unit_name,
            "host": decided.host,
            "port": decided.port,
        },
        # the members' typed invocation is not a plan key: their words are
        "members": [_member_json(m, words) for m in decided.members],
    }


def _member_json(member: AnyServer, words: str | None) -> dict[str, Any]:
    dumped = member.model_dump(mode="json", exclude={"invocation"})
    if words is not None:
        dumped[words] = getattr(member, words)
    return dumped


class PlanView(ABC):
    """One engine's endpoints, as `epycctl plan` shows them."""

    engine: ClassVar[str]
    plan_keys: ClassVar[tuple[str, ...]] = ()
    """Its own keys of `plan --json`, after every endpoint's (null for other engines')."""

    @abstractmethod
    def json_keys(self, decided: EndpointDecisions, dumped: dict[str, Any]) -> dict[str, Any]:
        """Its plan keys that are not a field of the same name (`dumped`): a set's, its
        memory fit's, its device's (docs/architecture.md, "Plan keys")."""

    @abstractmethod
    def backend_text(self, decided: EndpointDecisions) -> str:
        """What serves it, for the table's Backend row."""

    @abstractmethod
    def path_text(self, decided: EndpointDecisions) -> str:
        """Where it runs, for the table's Path row."""

    @abstractmethod
    def endpoint_rows(self, decided: EndpointDecisions) -> list[Row]:
        """One server's rows (its fit, CPUs and context, or its device's)."""

    @abstractmethod
    def server_rows(self, server: AnyServer) -> tuple[Row, Row, Row]:
        """One server's memory fit, CPU and context rows on CPUs (a set shows its tightest
        member's)."""

    def set_bind_text(self, decided: EndpointDecisions) -> str:
        """What a set's CPU row adds after its pinned cores."""
        return ""

    @abstractmethod
    def member_text(self, member: AnyServer) -> tuple[str, str]:
        """A set member's threads and its batch, in its row of the set."""
