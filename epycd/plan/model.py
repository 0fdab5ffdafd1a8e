"""What a server's decisions are built on, whatever its engine: the unit it runs
(`EndpointService`: the model it serves and how, where it listens, how it heals, what the
approver must review), where it is pinned (`CpuPlacement`), one server on CPUs (`CpuServer`)
or on GPUs (`GpuServer`), and what an engine's servers share across their endpoint
(`EngineService`). The endpoint of one or several servers, and its plan, are
`epycd.plan.endpoint`'s.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    ClassVar,
    Literal,
    Protocol,
)

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from epycd.health import PrimaryEndpoint
from epycd.model.facts import POOLING_ENDPOINTS
from epycd.plan.healing import Healing, Restart
from epycd.plan.problem import Problem
from epycd.plan.tuning import LIMIT_MEMLOCK, LIMIT_NOFILE

Runtime = Literal["podman", "docker", "host"]


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


class OnDemand(BaseModel):
    """How an on-demand endpoint is served (docs/on-demand.md): systemd holds the endpoint's
    address (its `.socket`), a proxy started by the first connection starts the engine, which
    listens on loopback (`engine_port`), and stops when the proxy has been idle for
    `idle_stop_s`. The engines of one swap group share their cores and memory, so at most one
    of them runs (`Conflicts=` between their units)."""

    model_config = ConfigDict(frozen=True)

    engine_port: int = Field(description="the loopback port the engine listens on")
    idle_stop_s: int = Field(description="the proxy exits, and the engine stops, after this idle")
    swap_group: list[str] = Field(
        default_factory=list,
        description="the on-demand endpoints that share its cores and memory, itself included; "
        "each stops the others when it starts",
    )


class ConvertedWeights(BaseModel):
    """A safetensors model llama.cpp serves as the GGUF file approve converted it to
    (docs/conversion.md): what it came from and the file's hash, which binds the approval to
    that file (a different file is a different plan)."""

    model_config = ConfigDict(frozen=True)

    source: str = Field(description="the model the endpoint file names: a hub id or a folder")
    source_revision: str | None = Field(description="the hub commit it was converted at")
    quantize: str = Field(description="q8_0, q4_k_m or bf16")
    sha256: str = Field(description="the converted file's SHA-256")
    source_identity: str | None = Field(
        default=None,
        description="what it was converted from: folder:RESOLVED-PATH or hub:ORG/NAME@COMMIT "
        "(None in an approval recorded before the product bound a file to its source: such "
        "an approval loads, and differs from the plan made now)",
    )
    source_sha256: str | None = Field(
        default=None,
        description="the SHA-256 of the files the converter read (names and contents)",
    )


class EngineChoice(BaseModel):
    """Why this engine serves the endpoint: the choice of `engine = "auto"` (docs/tuning.md
    rule 12), or the conversion of a safetensors model for a llama.cpp endpoint."""

    model_config = ConfigDict(frozen=True)

    asked: str = Field(description='the endpoint file\'s `engine`: "auto" or an engine')
    reasons: list[str] = Field(description="why: the rule, and each engine passed over")
    converted: ConvertedWeights | None = None


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
    model_aliases: list[str] = Field(
        default_factory=list,
        description="the endpoint file's `aliases`: more names the gateway routes here (and "
        "vLLM answers to); left out of a record when empty, so that the records of every "
        "other endpoint are as they were",
        exclude_if=lambda names: not names,
    )
    model_kind: str
    primary_endpoint: PrimaryEndpoint
    embedding_width: int | None = Field(
        default=None,
        description="an embeddings endpoint's vector width, which its gate checks (the "
        "model's, where its files say); left out of a record when None, so that the records "
        "of every other endpoint are as they were",
        exclude_if=lambda width: width is None,
    )
    runtime: Runtime
    dtype: str = Field(description="vLLM's --dtype; a GGUF file's own weight type")
    port: int
    host: str = Field(
        default="127.0.0.1",
        description="the address the endpoint listens on (vLLM's --host, or a set's "
        "balancer); loopback unless the endpoint file says otherwise",
    )
    on_demand: OnDemand | None = Field(
        default=None,
        description="how it starts on a request and stops when idle (`port` and `host` are "
        "then the socket's); left out when None, so that the records of every other endpoint "
        "are as they were",
        exclude_if=lambda on_demand: on_demand is None,
    )
    engine_choice: EngineChoice | None = Field(
        default=None,
        description='why its engine serves it (`engine = "auto"`, a converted model); left '
        "out when None, so that the records of every other endpoint are as they were",
        exclude_if=lambda choice: choice is None,
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

    @property
    def pooling(self) -> bool:
        """An embedder or a reranker (as `ModelFacts.pooling` says of its model)."""
        return self.primary_endpoint in POOLING_ENDPOINTS

    if TYPE_CHECKING:
        # What every engine's decisions give, as a field or a property: the core reads them
        # whatever the engine (pydantic would take a property declared here for a field).

        @property
        def kind(self) -> str:
            """Which of its engine's server types (`server_types`); a set's `set_kind`."""

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


class EngineService(BaseModel):
    """The fields an engine's servers share across their endpoint (its route: which build
    serves them, from where): an endpoint stores them once, beside its service's fields,
    and each of its servers reads them from there (`Endpoint`)."""

    model_config = ConfigDict(frozen=True)


class HostService(EngineService):
    """What the servers of an engine that runs them on the host alone share in place of
    vLLM's route: no image and no vLLM executable; what serves it, for its fingerprint, is
    its engine. An engine's own service model may build on it."""

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
    """One server process on CPUs, of any engine: a single endpoint's or one member of a
    set. Each engine's own type adds its decisions and its fit in the nodes' memory."""

    set_kind: ClassVar[str]
    """What `plan --json` calls an endpoint of several of these (its `kind`)."""

    @property
    def device(self) -> Literal["cpu", "instinct"]:
        """Where it computes: CPUs."""
        return "cpu"

    @property
    def gpus_held(self) -> list[int]:
        """The GPU indices it holds: none on CPUs."""
        return []

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

    set_kind: ClassVar[str] = "instinct"
    """Its endpoint is one server: a set is on CPUs."""

    @property
    def cpu_fit(self) -> ServerFit | None:
        """None: its engine's own fit on the GPUs refuses it."""
        return None

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
        def env(self) -> dict[str, str]:
            """Its environment; never a secret."""


AnyServer = CpuServer | GpuServer
"""One server of an endpoint, of any engine: the decisions of one unit's process."""
