"""What each engine does for the planner (`EnginePlanner`): its runtime found on the host,
its endpoint prepared (route, model check), its trial memory fit, the GPUs it spans, its
server's decisions on a placement of CPUs or of GPUs, and the refusal of one that does not fit. One
implementation per engine (`epycd.engines.ENGINE.plan.planner`), listed by
`epycd.plan.engines`; preparing, placing, sets and finishing ask it and never name an
engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from epycd.errors import Refusal
from epycd.host.facts import HostFacts
from epycd.plan.model import AnyServer, CpuServer, GpuServer, HfCacheMount
from epycd.plan.placement.alloc import Placement
from epycd.plan.placement.gpu import GpuPlacement, GpuSizer
from epycd.plan.placement.instances import Slot
from epycd.plan.placement.sharing import Sharing
from epycd.plan.prepared import Prepared, Sources
from epycd.settings import Settings
from epycd.spec import SpecResult
from epycd.stack import Stack


class EnginePlanner(ABC):
    """One engine's planning."""

    engine: ClassVar[str]
    """Its name, as the endpoint file's `engine` says (`epycd.engines.Engine.name`)."""

    def with_runtime(
        self, host: HostFacts, specs: list[SpecResult], settings: Settings, sources: Sources
    ) -> HostFacts:
        """The host with the engine's own runtime (built by install.sh) when an endpoint file
        asks for it and the host has no other; probed only then."""
        return host

    @abstractmethod
    def prepare(
        self,
        result: SpecResult,
        host: HostFacts,
        stack: Stack,
        sources: Sources,
        secret_group: int | None,
    ) -> Prepared:
        """The endpoint's route chosen, its secrets checked, its model inspected; raises the
        `EpycError` of what it cannot serve. `secret_group`: the admin group of epycd.conf's
        `trusted_admin_gid`, which may own a key or token file."""

    @abstractmethod
    def fits(
        self,
        prepared: Prepared,
        host: HostFacts,
        stack: Stack,
        placement: Placement,
        memory_share: float,
    ) -> bool:
        """Whether one server fits `memory_share` of the placement's memory (a set's layout
        tries placements with it)."""

    @abstractmethod
    def decide(
        self,
        prepared: Prepared,
        *,
        host: HostFacts,
        stack: Stack,
        placement: Placement,
        port: int,
        hf_cache: HfCacheMount,
        product_python: str,
        status_file: str,
        memory_share: float = 1.0,
    ) -> CpuServer:
        """One server's decisions on its placement and port."""

    def layout_warnings(self, slots: Sequence[Slot]) -> list[str]:
        """What the admin should know of a set's instances on these slots (their cores)."""
        return []

    @abstractmethod
    def unfit(self, prepared: Prepared, server: AnyServer) -> Refusal:
        """The refusal of a server that does not fit its nodes' memory, with the terms of
        what it needs and the fix."""

    def gpu_sizer(self, prepared: Prepared) -> GpuSizer:
        """How many GPUs of a kind the endpoint spans, and the fit behind it (an endpoint
        file's `device = "instinct"`). An engine that serves on CPUs alone keeps this: its
        keys refuse a `device`, so no endpoint of it is placed on GPUs."""
        raise NotImplementedError(f"{self.engine} serves on CPUs only")

    def decide_on_gpus(
        self, prepared: Prepared, share: Sharing, placement: GpuPlacement, port: int
    ) -> GpuServer:
        """One server's decisions on the GPUs placed for it (an endpoint file's `device =
        "instinct"`). An engine that serves on CPUs alone keeps this: its keys refuse a
        `device`, so no endpoint of it is placed on GPUs."""
        raise NotImplementedError(f"{self.engine} serves on CPUs only")
