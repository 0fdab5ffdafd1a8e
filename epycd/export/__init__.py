"""Exports: the same approved or current plan written for another engine than systemd.

`export_kube` turns a `Plan` into Kubernetes objects (and a KServe InferenceService), the
KubeletConfiguration fragment the nodes need (`kubelet.py`), and the notes that say, in
words, each host decision with no Kubernetes equivalent (docs/fleet.md). Each engine writes
its own objects (`EXPORTER`, a `KubeExporter`, in its package's `export/kube.py`); an engine
without one says why (`Engine.no_kube_export`), and its endpoints are refused with that.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epycd.engines import ENGINES, engine_named
from epycd.errors import InputError

if TYPE_CHECKING:
    from epycd.host.facts import HostFacts
    from epycd.plan.endpoint import Plan
    from epycd.stack import Stack


@dataclass
class KubeExport:
    objects: list[dict[str, Any]]
    kubelet_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"objects": self.objects, "kubelet_config": self.kubelet_config,
                "notes": self.notes}  # fmt: skip


class KubeExporter(ABC):
    """One engine's Kubernetes export of its endpoints' plans."""

    @abstractmethod
    def export(
        self, plan: Plan, host: HostFacts, stack: Stack, *, kserve: bool, model_volume: str | None
    ) -> KubeExport:
        """The plan as Kubernetes objects, the nodes' kubelet fragment and the notes. Raises
        InputError (naming the endpoint file and the fix) for what it cannot write."""


def export_kube(
    plan: Plan,
    host: HostFacts,
    stack: Stack,
    *,
    kserve: bool = False,
    model_volume: str | None = None,
) -> KubeExport:
    """The plan as its engine exports it, or the refusal of an engine without an export."""
    decisions = plan.decisions
    engine = engine_named(decisions.engine)
    if engine.no_kube_export is not None:
        raise InputError(
            f"a {engine.title} endpoint has no Kubernetes export yet: {engine.no_kube_export}",
            file=decisions.config_file,
            key="engine",
            fix=f"export a {exportable()} endpoint, or serve this one with its systemd unit",
        )
    exporter = engine.implementation("export.kube", "EXPORTER", KubeExporter)
    return exporter.export(plan, host, stack, kserve=kserve, model_volume=model_volume)


def exportable() -> str:
    """The engines whose endpoints have a Kubernetes export ("vLLM")."""
    return " or ".join(e.title for e in ENGINES if e.no_kube_export is None)
