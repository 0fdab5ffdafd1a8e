"""What a plan is: every decision for one endpoint, then the units rendered from it.

`EndpointDecisions` is the planner's output and the renderer's only input, so rendering
stays a pure function of decisions. `Plan` adds the rendered units and the fingerprint;
`plan --json` prints it (docs/architecture.md, "Plan keys").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    TypeVar,
)

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, SerializeAsAny

from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.model.gpu_memory import GpuFit
from epycd.plan.healing import Healing, Restart
from epycd.plan.problem import Problem
from epycd.plan.tuning import LIMIT_MEMLOCK, LIMIT_NOFILE

Runtime = Literal["podman", "docker", "host"]
PrimaryEndpoint = Literal["chat_completions", "completions"]


class ServerFit(Protocol):
    """One server's fit in its NUMA nodes' memory, whatever its engine's terms."""

    @property
    def fits(self) -> bool: ...
    @property
    def required_gb(self) -> float: ...
    @property
    def available_gb(self) -> float: ...
    @property
    def action(self) -> str: ...


class HfCacheMount(BaseModel):
    host_path: str = Field(description="HF_HOME resolved on the host, symlinks followed")
    container_path: str = "/root/.cache/huggingface"
    on_nfs: bool = False


class BindMount(BaseModel):
    """A host path the container sees: a local model folder or a chat template file."""

    host_path: str
    container_path: str
    read_only: bool = True


class EndpointService(BaseModel):
    """What every endpoint has, whatever runs it: the model it serves and how, the route
    (backend, runtime, image), the unit the admin starts (`unit_name`: the instance's own, or
    a set's balancer), where it listens, how it heals, and what the approver must review.
    Frozen: once decided, a field is not reassigned (the planner appends late errors)."""

    model_config = ConfigDict(frozen=True)

    endpoint: str = Field(description="the endpoint file's stem")
    unit_name: str = Field(description="epyc-llm-NAME")
    config_file: str
    model: str
    model_revision: str | None = None
    served_model_name: str
    model_kind: str
    primary_endpoint: PrimaryEndpoint
    runtime: Runtime
    dtype: str = Field(description="vLLM's --dtype; a GGUF file's own weight type")
    port: int
    host: str = Field(
        default="127.0.0.1",
        description="the address the endpoint listens on (vLLM's --host, or a set's "
        "balancer); loopback unless the endpoint file says otherwise",
    )
    profile: Literal["balanced", "latency", "throughput"] = "balanced"
    limit_nofile: int = Field(
        default=LIMIT_NOFILE, description="LimitNOFILE= / --ulimit nofile (rule 5)"
    )
    limit_memlock: str = Field(
        default=LIMIT_MEMLOCK, description="LimitMEMLOCK= / --ulimit memlock (rule 5)"
    )
    hf_cache: HfCacheMount | None = None
    home_read_paths: list[str] = Field(
        default_factory=list,
        description="host path: what the endpoint reads under /root or /home (its vLLM "
        "environment, local model, chat template), bound read-only into its unit",
    )
    hf_token_file: str | None = Field(
        default=None, description="root-only file whose contents become HF_TOKEN at start"
    )
    api_key_file: str | None = Field(
        default=None,
        description="root-only file holding the API key vLLM requires (VLLM_API_KEY); the key "
        "itself is never in a plan, a unit or an argv",
    )
    chat_template: str | None = None
    restart: Restart = "no"
    healing: Healing | None = Field(
        default=None, description="restart policy and watchdog; None in records made before it"
    )
    start_timeout_s: int = Field(description="TimeoutStartSec, sized for the model")
    podman_notify_healthy: bool = False
    product_python: str = Field(description="interpreter that runs epycd's supervisor/checks")
    exec_condition: list[list[str]] = Field(
        default_factory=list,
        description="ExecCondition= commands (the approval check): exit 1-254 skips the start "
        "without failing the unit, so Restart= never loops on a refused endpoint",
    )
    status_file: str | None = Field(
        default=None, description="EPYCD_RUN_DIR/NAME.json: the supervisor's state for status"
    )
    requires_confirmation: bool = False
    confirmation_reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    errors: list[Problem] = Field(default_factory=list)

    # An endpoint is this service plus its servers: one, or a set's members behind its
    # balancer. The core reads every endpoint through these, never by its type.

    @property
    def servers(self) -> Sequence[ServerEndpoint]:
        """Its servers, each with its placement and its engine's decisions: the endpoint
        itself when it is one server, a set's members (whose unit is the balancer's)."""
        raise NotImplementedError(type(self).__name__)

    @property
    def instance_set(self) -> InstanceSet[Any] | None:
        """A set's instances behind its balancer; None for an endpoint of one server."""
        return None

    @property
    def tightest_server(self) -> ServerEndpoint:
        """The server with the least room: the endpoint is sized, and refused, by it."""
        [server] = self.servers  # a set chooses among its members
        return server

    @property
    def device(self) -> Literal["cpu", "instinct"]:
        """Where its servers compute: CPUs, or Instinct GPUs."""
        return "cpu"

    @property
    def gpus_held(self) -> list[int]:
        """The GPU indices its servers hold; none on CPUs."""
        return []

    @property
    def cpu_fit(self) -> ServerFit | None:
        """Its fit in its NUMA nodes' memory (a set's: its tightest server's); None on
        GPUs, where its engine's own fit refuses."""
        return None

    if TYPE_CHECKING:
        # What every engine's decisions give, as a field or a property: the core reads them
        # whatever the engine (pydantic would take a property declared here for a field).

        @property
        def kind(self) -> str:
            """Which of its engine's types of decisions (`decision_types`)."""

        @property
        def engine(self) -> str:
            """The engine's name (`epycd.engines`)."""

        @property
        def backend_name(self) -> str:
            """What serves it, for its fingerprint."""

        @property
        def image(self) -> str | None:
            """Its container image; None for a server on the host."""

        @property
        def vllm_executable(self) -> str | None: ...

        @property
        def instance(self) -> int | None:
            """Which instance of a set a server is; None for an endpoint."""

        @property
        def socket(self) -> int | None:
            """The socket it is on; None for a set across sockets."""

        @property
        def socket_reason(self) -> str: ...

        @property
        def cpus(self) -> str:
            """Every core its servers are pinned to."""

        @property
        def numa_nodes(self) -> list[int]: ...

        @property
        def omp_cpus(self) -> str:
            """The cores its compute threads run on ("" on GPUs)."""

        @property
        def kv_cache_gb(self) -> int | float:
            """Its KV pool (a set's: its tightest member's), GiB."""

        @property
        def max_model_len(self) -> int:
            """The context it serves."""

        @property
        def max_num_seqs(self) -> int:
            """The sequences one server runs at once (a set's: its tightest member's)."""


class HostService(BaseModel):
    """What the servers of an engine that runs them on the host alone share in place of
    vLLM's route: no image and no vLLM executable; what serves it, for its fingerprint, is
    its engine. An engine's own service model (`EnginePlanner.service_type`) may build on it."""

    model_config = ConfigDict(frozen=True)

    @property
    def image(self) -> str | None:
        """No container image: its server runs on the host."""
        return None

    @property
    def vllm_executable(self) -> str | None:
        return None

    @property
    def backend_name(self) -> str:
        """What serves it, for its fingerprint: the engine."""
        return self.engine

    if TYPE_CHECKING:

        @property
        def engine(self) -> str: ...


class CpuPlacement(BaseModel):
    """Where one server process is pinned: a socket's physical cores and NUMA nodes (an
    Instinct server's are its GPUs' nodes, for the host side of the engine)."""

    model_config = ConfigDict(frozen=True)

    instance: int | None = Field(
        default=None, description="which instance of a set this is (docs/instances.md)"
    )
    socket: int
    socket_reason: str
    cpus: str = Field(description="pinned set (cpuset, CPUAffinity=): the server's physical cores")
    numa_nodes: list[int]


class CpuServer(EndpointService, CpuPlacement):
    """One server process on CPUs, of any engine: a single endpoint or one member of a set.
    Each engine's own type adds its decisions and its fit in the nodes' memory."""

    @property
    def servers(self) -> Sequence[ServerEndpoint]:
        return [self]

    @property
    def cpu_fit(self) -> ServerFit:
        """Its fit in its NUMA nodes' memory: its engine's type gives it."""
        raise NotImplementedError(type(self).__name__)

    if TYPE_CHECKING:
        # Every engine's server gives them, as a field or a property.

        @property
        def env(self) -> dict[str, str]:
            """Its environment; never a secret."""


class GpuServer(EndpointService, CpuPlacement):
    """One server on GPUs, of any engine (an Instinct endpoint, docs/instinct.md): its CPUs
    and nodes are the GPUs' NUMA node(s), for the host side of the engine; its engine's type
    adds the GPUs, their fit in VRAM and its own decisions. It refuses by its own fit, never
    by the nodes' memory."""

    @property
    def servers(self) -> Sequence[ServerEndpoint]:
        return [self]

    @property
    def device(self) -> Literal["cpu", "instinct"]:
        return "instinct"

    @property
    def gpus_held(self) -> list[int]:
        return list(self.gpus)

    @property
    def omp_cpus(self) -> str:
        """No cores: its compute runs on its GPUs."""
        return ""

    if TYPE_CHECKING:
        # Every engine's server on GPUs gives them, as a field or a property.

        @property
        def gpus(self) -> list[int]:
            """The GPU indices it holds."""

        @property
        def gpu_fit(self) -> GpuFit:
            """Its fit in each GPU's memory."""

        @property
        def env(self) -> dict[str, str]:
            """Its environment; never a secret."""


Member = TypeVar("Member", bound=CpuServer)
"""One instance of a set: a server of the set's engine."""


class InstanceSet(BaseModel, Generic[Member]):
    """The instances of a set behind its balancer (docs/instances.md): how many and why,
    how many must be ready, and each member, a whole instance on a loopback port."""

    model_config = ConfigDict(frozen=True)

    requested: int | str = Field(description='the endpoint file\'s instances: N or "auto"')
    placement: Literal["socket", "host"]
    count: int
    min_ready: int = Field(description="instances that must pass the health gate")
    balancer: Literal["haproxy"] = "haproxy"
    reasons: list[str] = Field(description="why this many instances")
    members: list[Member]


class BalancedSet(EndpointService, Generic[Member]):
    """An endpoint of several instances behind one balancer, of either engine: its own unit,
    address and healing are the balancer's; what the instances hold together (CPUs, nodes,
    memory) is computed from the members, never stored twice."""

    instances: InstanceSet[Member]

    @property
    def members(self) -> list[Member]:
        return self.instances.members

    @property
    def servers(self) -> Sequence[Member]:
        return self.members

    @property
    def instance_set(self) -> InstanceSet[Member]:
        return self.instances

    @property
    def tightest_server(self) -> Member:
        return self.worst_member

    @property
    def instance(self) -> None:
        """The set itself is no instance."""
        return None

    @property
    def cpus(self) -> str:
        return format_cpulist(sorted(c for m in self.members for c in parse_cpulist(m.cpus)))

    @property
    def numa_nodes(self) -> list[int]:
        return sorted({node for m in self.members for node in m.numa_nodes})

    @property
    def sockets(self) -> list[int]:
        return sorted({m.socket for m in self.members})

    @property
    def socket_reason(self) -> str:
        return f"{self.instances.count} instances: " + "; ".join(self.instances.reasons)

    @property
    def socket(self) -> int | None:
        """The socket every member is on; None for a set across sockets."""
        sockets = self.sockets
        return sockets[0] if len(sockets) == 1 else None

    @property
    def max_model_len(self) -> int:
        """The context every member serves."""
        return min(m.max_model_len for m in self.members)

    @property
    def worst_member(self) -> Member:
        """The member with the least room: the set is sized, and refused, by it."""
        return min(self.members, key=lambda m: (required_fits(m), m.max_num_seqs))

    @property
    def cpu_fit(self) -> ServerFit:
        """The fit of the member with the least room."""
        return self.worst_member.cpu_fit

    @property
    def omp_cpus(self) -> str:
        """Every core the members' compute threads run on."""
        return format_cpulist(sorted(c for m in self.members for c in parse_cpulist(m.omp_cpus)))

    @property
    def kv_cache_gb(self) -> int | float:
        return self.worst_member.kv_cache_gb

    @property
    def max_num_seqs(self) -> int:
        return self.worst_member.max_num_seqs


def required_fits(process: CpuServer) -> bool:
    """Whether one CPU process fits its nodes' memory."""
    return process.cpu_fit.fits


def required_gb(process: CpuServer) -> float:
    """What one CPU process needs of its nodes' memory, OS headroom included."""
    return process.cpu_fit.required_gb


ServerEndpoint = CpuServer | GpuServer
"""An endpoint whose unit runs one server process, of any engine."""

SetEndpoint = BalancedSet[Any]
"""An endpoint of several instances behind a balancer."""

CpuDecisions = CpuServer | SetEndpoint
"""An endpoint on CPUs, fitted in its NUMA nodes' memory."""


@cache
def decision_types() -> dict[str, type[EndpointService]]:
    """Every registered engine's types of decisions (`DECISIONS` in its package's
    `plan/model.py`), by their `kind`."""
    from epycd import engines

    types: dict[str, type[EndpointService]] = {}
    for engine in engines.ENGINES:
        for kind in engine.implementation("plan.model", "DECISIONS", tuple):
            types[kind.model_fields["kind"].default] = kind
    return types


def decisions_of(value: object) -> EndpointService:
    """An endpoint's decisions, as the type their `kind` names (a record's JSON, or
    decisions already made)."""
    if isinstance(value, EndpointService):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"decisions are an object, not {type(value).__name__}")
    kind = value.get("kind")
    types = decision_types()
    if kind not in types:
        raise ValueError(f"decisions of kind {kind!r}: no registered engine makes them")
    return types[kind].model_validate(value)


EndpointDecisions = Annotated[SerializeAsAny[EndpointService], PlainValidator(decisions_of)]
"""Everything decided for one endpoint, no rendered text: one of the types its engine
makes (`decision_types`), read back by its `kind`."""


def server_processes(decisions: EndpointDecisions) -> list[ServerEndpoint]:
    """The endpoint's server processes, of any engine: a set's members, or the endpoint
    itself."""
    return list(decisions.servers)


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
    def instance_set(self) -> InstanceSet[Any] | None:
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
