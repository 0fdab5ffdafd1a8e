"""What a plan is: the endpoint, every decision for it, then the units rendered from it.

`Endpoint` (`EndpointDecisions`) is the one endpoint type of every engine, device and count:
its service and its servers. It is the planner's output and the renderer's only input, so
rendering stays a pure function of decisions. `Plan` adds the rendered units and the
fingerprint; `plan --json` prints it (docs/architecture.md, "Plan keys").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Literal,
    NamedTuple,
)

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    SerializationInfo,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.plan.invocation_facts import InvocationFacts, in_record
from epycd.plan.model import (
    AnyServer,
    CpuServer,
    EndpointService,
    EngineService,
    GpuServer,
    ServerFit,
)


class InstanceSet(BaseModel):
    """How an endpoint of several servers is balanced (docs/instances.md): how many and
    why, how many must be ready. Its servers are the endpoint's own (`Endpoint.servers`)."""

    model_config = ConfigDict(frozen=True)

    requested: int | str = Field(description='the endpoint file\'s instances: N or "auto"')
    placement: Literal["socket", "host"]
    count: int
    min_ready: int = Field(description="instances that must pass the health gate")
    balancer: Literal["haproxy"] = "haproxy"
    reasons: list[str] = Field(description="why this many instances")


@cache
def server_types() -> dict[str, type[CpuServer | GpuServer]]:
    """Every registered engine's types of server (`SERVERS` in its package's
    `plan/model.py`), by their `kind`."""
    from epycd import engines

    types: dict[str, type[CpuServer | GpuServer]] = {}
    for engine in engines.ENGINES:
        for kind in engine.implementation("plan.model", "SERVERS", tuple):
            types[kind.model_fields["kind"].default] = kind
    return types


def server_of(value: object) -> AnyServer:
    """One server's decisions, as the type their `kind` names."""
    if isinstance(value, CpuServer | GpuServer):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"a server's decisions are an object, not {type(value).__name__}")
    kind = value.get("kind")
    types = server_types()
    if kind not in types:
        raise ValueError(f"a server of kind {kind!r}: no registered engine makes it")
    return types[kind].model_validate(value)


@cache
def shared_fields(server_type: type[BaseModel]) -> frozenset[str]:
    """A server's fields that its endpoint holds once for all its servers: the service's
    and its engine's (`EngineService`). A set's member keeps those that are its own (its
    unit, its port), as any server keeps a field whose value is not the endpoint's."""
    names = set(EndpointService.model_fields)
    for base in server_type.__mro__:
        if issubclass(base, EngineService) and not issubclass(base, EndpointService):
            names |= set(base.model_fields)
    return frozenset(names)


ServerDecisions = Annotated[SerializeAsAny[AnyServer], PlainValidator(server_of)]


class Endpoint(EndpointService):
    """An endpoint, whatever its engine, device or count: its service (the unit the admin
    starts: a single server's own, or a set's balancer), and its servers, each with its
    placement and its engine's decisions. A set is more than one server behind a balancer
    (`instances`); an Instinct endpoint is a server placed on GPUs.

    Stored once: a dump holds the fields the servers share (`shared_fields`) at the top, and
    each server only what is its own; reading fills each server from the top. An approval
    record of an endpoint of one server leaves out at the top what that server's invocation
    holds too. A record of an earlier format (one flat object per server, a set's members
    under `instances`) is brought to this shape by `epycd.approval.migrate`."""

    servers: list[ServerDecisions] = Field(min_length=1)
    instances: InstanceSet | None = Field(
        default=None, description="how a set of servers is balanced; None for one server"
    )

    @classmethod
    def of_server(cls, server: AnyServer) -> Endpoint:
        """The endpoint of one server: its unit is the server's own."""
        service = {name: getattr(server, name) for name in EndpointService.model_fields}
        return cls.model_validate({**service, "servers": [server]})

    @model_validator(mode="before")
    @classmethod
    def _servers_filled(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("servers"), list):
            return data
        top = {key: value for key, value in data.items() if key not in ("servers", "instances")}
        servers = [_server_under(top, server) for server in data["servers"]]
        if data.get("instances") is None and len(servers) == 1:
            top = servers[0].model_dump(include=set(EndpointService.model_fields)) | top
        return {**top, "servers": servers, "instances": data.get("instances")}

    @model_serializer(mode="wrap")
    def _shared_once(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        servers: list[dict[str, Any]] | None = data.pop("servers", None)
        if not servers:  # a dump that leaves them out
            return data
        shared = shared_fields(type(self.servers[0]))
        # the endpoint's own service, then what its servers share of their engine's
        top = data | {key: servers[0][key] for key in shared - set(data) if key in servers[0]}
        if in_record(info) and self.instances is None:
            # what the server's invocation holds, its record left out: so does the top
            fields = type(self.servers[0]).model_fields
            top = {k: v for k, v in top.items() if k not in fields or k in servers[0]}
        top["servers"] = [
            {
                key: value
                for key, value in server.items()
                if key not in shared or key not in top or top[key] != value
            }
            for server in servers
        ]
        return top

    @property
    def instance_set(self) -> InstanceSet | None:
        return self.instances

    @property
    def unit_decisions(self) -> EndpointService:
        """The decisions of the unit the admin starts, as `plan --json` and a plan's diff
        show them: its only server's (whose unit it is), or a set's own (its balancer's),
        with its servers."""
        return self.first if self.instances is None else self

    @property
    def members(self) -> list[AnyServer]:
        """A set's servers; none for an endpoint of one server."""
        return list(self.servers) if self.instances is not None else []

    @property
    def first(self) -> AnyServer:
        """Its first server, whose engine and route every server shares."""
        return self.servers[0]

    @property
    def tightest_server(self) -> AnyServer:
        """The server with the least room: the endpoint is sized, and refused, by it."""
        if self.device == "instinct":
            return self.first
        return min(self.servers, key=lambda s: (_fits(s), s.max_num_seqs))

    @property
    def kind(self) -> str:
        """Its server's kind; a set's (`set_kind`) for more than one."""
        first = self.first
        return first.set_kind if self.instances is not None else first.kind

    @property
    def engine(self) -> str:
        return self.first.engine

    @property
    def backend_name(self) -> str:
        return self.first.backend_name

    @property
    def image(self) -> str | None:
        return self.first.image

    @property
    def vllm_executable(self) -> str | None:
        return self.first.vllm_executable

    @property
    def device(self) -> Literal["cpu", "instinct"]:
        return self.first.device

    @property
    def gpus_held(self) -> list[int]:
        return sorted({gpu for server in self.servers for gpu in server.gpus_held})

    @property
    def cpu_fit(self) -> ServerFit | None:
        """Its fit in its NUMA nodes' memory (a set's: its tightest server's); None on
        GPUs, where its engine's own fit refuses."""
        if self.device == "instinct":
            return None
        return self.tightest_server.cpu_fit

    @property
    def instance(self) -> None:
        """An endpoint is no instance of a set."""
        return None

    @property
    def cpus(self) -> str:
        """Every core its servers are pinned to."""
        return format_cpulist(sorted({c for s in self.servers for c in parse_cpulist(s.cpus)}))

    @property
    def numa_nodes(self) -> list[int]:
        return sorted({node for s in self.servers for node in s.numa_nodes})

    @property
    def sockets(self) -> list[int]:
        return sorted({s.socket for s in self.servers})

    @property
    def socket(self) -> int | None:
        """The socket every server is on; None for a set across sockets."""
        sockets = self.sockets
        return sockets[0] if len(sockets) == 1 else None

    @property
    def socket_reason(self) -> str:
        if self.instances is None:
            return self.first.socket_reason
        return f"{self.instances.count} instances: " + "; ".join(self.instances.reasons)

    @property
    def omp_cpus(self) -> str:
        """Every core its servers' compute threads run on ("" on GPUs)."""
        return format_cpulist(sorted({c for s in self.servers for c in parse_cpulist(s.omp_cpus)}))

    @property
    def kv_cache_gb(self) -> int | float:
        return self.tightest_server.kv_cache_gb

    @property
    def max_model_len(self) -> int:
        """The context every server serves."""
        return min(s.max_model_len for s in self.servers)

    @property
    def max_num_seqs(self) -> int:
        return self.tightest_server.max_num_seqs


def _fits(server: AnyServer) -> bool:
    fit = server.cpu_fit
    return fit is None or fit.fits


def _server_under(top: dict[str, Any], server: object) -> AnyServer:
    """A server of an endpoint read back: what its invocation holds first (a set's member
    has its own port there, not the balancer's), then what the endpoint holds for all."""
    if not isinstance(server, dict):
        return server_of(server)
    kind = server_types().get(server.get("kind"))  # type: ignore[arg-type]
    if kind is not None and issubclass(kind, InvocationFacts):
        server = kind.with_invocation_facts(server)
    return server_of(top | server)


def decisions_of(value: object) -> Endpoint:
    """An endpoint's decisions (a record's JSON, an endpoint, or one server's decisions:
    the endpoint of that server)."""
    if isinstance(value, Endpoint):
        return value
    if isinstance(value, CpuServer | GpuServer):
        return Endpoint.of_server(value)
    if not isinstance(value, dict):
        raise ValueError(f"decisions are an object, not {type(value).__name__}")
    return Endpoint.model_validate(value)


EndpointDecisions = Annotated[Endpoint, BeforeValidator(decisions_of)]
"""Everything decided for one endpoint, no rendered text (`Endpoint`)."""


class Plan(BaseModel):
    """An endpoint's decisions, the units rendered from them and their fingerprints: what
    `epycctl plan` shows and an approval record stores."""

    model_config = ConfigDict(frozen=True)

    decisions: EndpointDecisions
    units: dict[str, str] = Field(description="unit file name -> exact text")
    unit_dirs: dict[str, str] = Field(
        default_factory=dict, description="unit file name -> the folder it is installed in"
    )
    fingerprint: str = Field(description="over the units and every input that shaped them")
    inputs_fingerprint: str = Field(
        default="", description="over the shaping inputs only: what drift compares"
    )

    @property
    def endpoint(self) -> str:
        return self.decisions.endpoint

    @property
    def unit_name(self) -> str:
        return self.decisions.unit_name

    @property
    def instance_set(self) -> InstanceSet | None:
        """The instances behind the balancer; None for an endpoint of one instance."""
        return self.decisions.instance_set

    @property
    def gpus(self) -> list[int]:
        """The GPUs the endpoint holds; none for an endpoint on CPUs."""
        return self.decisions.gpus_held


class RenderedUnits(NamedTuple):
    """The units rendered from one endpoint's decisions."""

    units: dict[str, str]
    """unit file name -> exact text"""
    unit_dirs: dict[str, str]
    """unit file name -> the folder it is installed in"""


UnitRenderer = Callable[
    [EndpointDecisions, Path, Path],
    RenderedUnits,
]
"""(decisions, unit folder, Quadlet folder) -> the units. The planner is given one
(`epycd.render.render_for_plan`) by the layer above, so the plan layer never imports the
renderer that sits on top of it."""
