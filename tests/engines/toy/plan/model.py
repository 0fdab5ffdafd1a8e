"""The toy engine's server: one stand-in server on CPUs (an endpoint's only one, or one of
a set's), and its fit: the weights and a GiB per slot against the nodes' memory."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from epycd.plan.model import CpuServer, HostService, ServerFit


class ToyFit(BaseModel):
    model_config = ConfigDict(frozen=True)

    required_gb: float
    available_gb: float

    @property
    def fits(self) -> bool:
        return self.required_gb <= self.available_gb

    @property
    def action(self) -> str:
        return "fits" if self.fits else "serve fewer slots, or a smaller model"


class ToyService(HostService):
    engine: Literal["toy"] = "toy"
    toy_version: str


class ToyServer(CpuServer, ToyService):
    kind: Literal["toy"] = "toy"
    set_kind: ClassVar[str] = "toy-set"
    env: dict[str, str] = Field(default_factory=dict)
    fit: ToyFit
    context: int
    slots: int
    server_args: list[str]

    @property
    def cpu_fit(self) -> ServerFit:
        return self.fit

    @property
    def omp_cpus(self) -> str:
        return self.cpus

    @property
    def kv_cache_gb(self) -> float:
        return float(self.slots)

    @property
    def max_model_len(self) -> int:
        return self.context

    @property
    def max_num_seqs(self) -> int:
        return self.slots


SERVERS = (ToyServer,)
