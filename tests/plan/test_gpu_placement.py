"""The core's GPU placement asks the endpoint's engine how many GPUs it spans (`GpuSizer`) and
picks which: the sizers here are the tests' own, no engine's, on a fake host of 8 MI300X
GPUs on two sockets (one GPU per NUMA node)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from epycd.errors import EpycError, Refusal
from epycd.host.facts import GpuFacts, HostFacts
from epycd.plan.placement.gpu import (
    GpuPlacement,
    GpuRequest,
    GpuSizer,
    GpuSizing,
    place_gpus,
)

HostOf = Callable[..., HostFacts]


class Spans(BaseModel):
    """A fit of the tests' own: how many GPUs, of which VRAM."""

    gpus: int
    vram_gb: float


class FixedSizer(GpuSizer):
    """An engine that always spans `count` GPUs and says so in a warning; `None` refuses."""

    def __init__(self, count: int | None) -> None:
        self.count = count
        self.asked: list[tuple[str, int]] = []

    def on(self, kind: Sequence[GpuFacts], count: int) -> GpuSizing | EpycError:
        self.asked.append(("on", count))
        return self._sizing(kind, count)

    def smallest(self, kind: Sequence[GpuFacts], free: int) -> GpuSizing | EpycError:
        self.asked.append(("smallest", free))
        if self.count is None:
            return Refusal("the toy model fits no GPU", key="model", fix="a smaller model")
        return self._sizing(kind, self.count)

    def _sizing(self, kind: Sequence[GpuFacts], count: int) -> GpuSizing:
        return GpuSizing(
            count=count,
            fit=Spans(gpus=count, vram_gb=kind[0].vram_gb),
            warnings=[f"spans {count}"],
        )


def request(name: str, sizer: GpuSizer, gpus: list[int] | None = None) -> GpuRequest:
    return GpuRequest(name=name, file=Path(f"/etc/epyc-llm/{name}.toml"), gpus=gpus, sizer=sizer)


def placed(result: GpuPlacement | EpycError) -> GpuPlacement:
    assert isinstance(result, GpuPlacement), result
    return result


def test_the_engine_says_how_many_and_the_core_picks_one_sockets_gpus(host_of: HostOf) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    sizer = FixedSizer(2)
    first = placed(place_gpus([request("a", sizer)], host, held={})["a"])
    assert first.gpus == [0, 1]
    assert first.fit == Spans(gpus=2, vram_gb=host.gpus[0].vram_gb)
    assert first.warnings == ["spans 2"]
    assert sizer.asked == [("smallest", len(host.gpus))]
    assert first.numa_nodes == sorted(
        {g.numa_node for g in host.gpus[:2] if g.numa_node is not None}
    )
    assert set(first.cpus) == {cpu for n in first.numa_nodes for cpu in host.node(n).cpus}


def test_gpus_held_by_another_endpoint_are_not_free(host_of: HostOf) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    sizer = FixedSizer(4)
    result = placed(place_gpus([request("b", sizer)], host, held={"a": [0, 1]})["b"])
    assert not set(result.gpus) & {0, 1}
    assert sizer.asked == [("smallest", len(host.gpus) - 2)]
    sockets = {
        s.socket for s in host.socket_topology for n in s.numa_nodes if n in result.numa_nodes
    }
    assert len(sockets) == 1


def test_a_listed_set_of_gpus_is_sized_on_exactly_that_count(host_of: HostOf) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    sizer = FixedSizer(None)
    result = placed(place_gpus([request("a", sizer, gpus=[6, 7])], host, held={})["a"])
    assert (result.gpus, result.reason, sizer.asked) == ([6, 7], "forced by gpus", [("on", 2)])


def test_the_engines_refusal_is_the_endpoints_own(host_of: HostOf) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    results = place_gpus(
        [request("big", FixedSizer(None)), request("ok", FixedSizer(1))], host, held={}
    )
    assert isinstance(results["big"], Refusal) and results["big"].key == "model"
    assert placed(results["ok"]).gpus == [0]


def test_an_approved_endpoint_keeps_its_gpus_while_its_engine_still_sizes_them(
    host_of: HostOf,
) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    sizer = FixedSizer(1)
    kept = GpuRequest(
        name="a", file=Path("/etc/epyc-llm/a.toml"), gpus=None, sizer=sizer, kept=[4, 5]
    )
    result = placed(place_gpus([kept], host, held={})["a"])
    assert (result.gpus, result.reason) == ([4, 5], "kept from its approved plan")
    assert sizer.asked == [("on", 2)]


def test_a_sizing_beyond_the_free_gpus_is_refused_whatever_the_engine_says(
    host_of: HostOf,
) -> None:
    host = host_of("genoa-2s-8x-mi300x")
    result = place_gpus([request("b", FixedSizer(8))], host, held={"a": [0]})["b"]
    assert isinstance(result, Refusal) and result.key == "gpus"
    assert "needs 8" in result.message and f"only {len(host.gpus) - 1}" in result.message
