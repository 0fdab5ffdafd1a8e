"""What a plan is: every decision for one endpoint, then the units rendered from it.

`EndpointDecisions` is the planner's output and the renderer's only input, so rendering
stays a pure function of decisions. `Plan` adds the rendered units and the fingerprint;
`plan --json` prints it (docs/architecture.md, "Plan keys").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from epycd.errors import EpycError, Refusal
from epycd.model.facts import MemoryFit
from epycd.model.gpu_memory import GpuFit
from epycd.plan.invocation import VllmInvocation
from epycd.plan.tuning import LIMIT_MEMLOCK, LIMIT_NOFILE

Backend = Literal["zentorch", "stock", "rocm"]
Runtime = Literal["podman", "docker", "host"]
PrimaryEndpoint = Literal["chat_completions", "completions"]
Restart = Literal["no", "on-failure"]


class HfCacheMount(BaseModel):
    host_path: str = Field(description="HF_HOME resolved on the host, symlinks followed")
    container_path: str = "/root/.cache/huggingface"
    on_nfs: bool = False


class BindMount(BaseModel):
    """A host path the container sees: a local model folder or a chat template file."""

    host_path: str
    container_path: str
    read_only: bool = True


class Problem(BaseModel):
    """An `EpycError` as data: the one shape in which an endpoint's errors are kept (its
    result, its decisions, the approval state's view of an unplanned endpoint) and shown
    (`text`, one line as the CLI prints the error)."""

    model_config = ConfigDict(frozen=True)

    message: str
    file: str | None = None
    key: str | None = None
    fix: str | None = None
    exit_code: int = Field(description="2 bad input, 1 refused")
    text: str = Field(description="the whole error as one line")

    @classmethod
    def of(cls, error: EpycError) -> Problem:
        return cls(
            message=error.message,
            file=error.file,
            key=error.key,
            fix=error.fix,
            exit_code=error.exit_code,
            text=str(error),
        )

    @classmethod
    def legacy(cls, value: object) -> object:
        """A plain string, as records and callers before `Problem` held an error: a refusal."""
        if isinstance(value, str):
            return cls(message=value, exit_code=Refusal.exit_code, text=value)
        return value


class Healing(BaseModel):
    """How an endpoint's units come back by themselves (docs/healing.md): systemd restarts a
    unit that failed or whose watchdog fired, after `restart_sec`; `start_limit_burst` failed
    runs within `start_limit_interval_s` make a crash loop, which keeps the unit down (across a
    reboot too) until `epycctl start NAME`."""

    model_config = ConfigDict(frozen=True)

    restart: Restart = Field(description='Restart=: "on-failure" unless the file says "no"')
    restart_sec: int = Field(description="RestartSec=: the pause before a restart")
    start_limit_burst: int = Field(
        description="failed runs within the interval that end in the crash-loop state"
    )
    start_limit_interval_s: int = Field(
        description="StartLimitIntervalSec=: long enough for that many starts at the full "
        "start budget, so a model that fails late in its start still counts"
    )
    watchdog_s: int | None = Field(
        description="WatchdogSec= of a unit whose main process is epycd's supervisor (host, "
        "docker): it pings while /health answers and the engine is not stalled; None where "
        "podman's health check kills the container instead (HealthOnFailure=kill)"
    )
    stall_s: int = Field(
        description="the engine counts as hung when requests are running and no prompt or "
        "generation token was counted for this long"
    )


class EndpointDecisions(BaseModel):
    """Everything decided for one endpoint; no rendered text. Frozen: once decided, a field
    is not reassigned (the planner appends its late errors to `errors`)."""

    model_config = ConfigDict(frozen=True)

    endpoint: str = Field(description="the endpoint file's stem")
    unit_name: str = Field(description="epyc-llm-NAME")
    config_file: str
    model: str
    model_revision: str | None = None
    served_model_name: str
    model_kind: str
    primary_endpoint: PrimaryEndpoint
    backend: Backend
    runtime: Runtime
    image: str | None = Field(description="container image; None on the host path")
    image_entrypoint_is_vllm_serve: bool = False
    vllm_executable: str | None = Field(default=None, description="host path only")
    vllm_version: str
    dtype: str
    socket: int
    socket_reason: str
    cpus: str = Field(description="pinned set (cpuset): the instance's physical cores")
    omp_cpus: str = Field(
        description="VLLM_CPU_OMP_THREADS_BIND: the pinned set without the front end's first "
        "core(s) (docs/tuning.md rule 1)"
    )
    numa_nodes: list[int]
    env: dict[str, str] = Field(description="environment for vLLM; never a secret")
    kv_cache_gb: int
    memory: MemoryFit
    port: int
    host: str = Field(
        default="127.0.0.1",
        description="the address vLLM listens on (--host); loopback unless "
        "the endpoint file says otherwise",
    )
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    profile: Literal["balanced", "latency", "throughput"] = "balanced"
    enforce_eager: bool = Field(
        default=False,
        description="a host vLLM without a C++ compiler or its interpreter's Python headers "
        "(docs/tuning.md rule 4)",
    )
    limit_nofile: int = Field(
        default=LIMIT_NOFILE, description="LimitNOFILE= / --ulimit nofile (rule 5)"
    )
    limit_memlock: str = Field(
        default=LIMIT_MEMLOCK, description="LimitMEMLOCK= / --ulimit memlock (rule 5)"
    )
    vllm_args: list[str] = Field(description="arguments after `vllm serve`, model first")
    invocation: VllmInvocation | None = Field(
        default=None,
        description="`vllm serve` typed; `vllm_args` are its words (epycd.plan.argv); "
        "None only in an approval record written before the planner filled it",
    )
    run_flags: list[str] = Field(default_factory=list, description="container run flags")
    hf_cache: HfCacheMount | None = None
    extra_mounts: list[BindMount] = Field(
        default_factory=list, description="containers: local model folder, chat template file"
    )
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
        default=None, description="restart policy and watchdog; None in records before issue 27"
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
    device: Literal["cpu", "instinct"] = "cpu"
    gpus: list[int] = Field(
        default_factory=list, description="Instinct: the GPU indices (HIP_VISIBLE_DEVICES)"
    )
    gfx_version: str | None = Field(default=None, description="Instinct: the GPUs' gfx target")
    tensor_parallel_size: int = 1
    gpu_fit: GpuFit | None = Field(default=None, description="Instinct: the VRAM fit per GPU")
    instance: int | None = Field(
        default=None, description="which instance of a set these decisions are (docs/instances.md)"
    )
    instances: InstanceSet | None = Field(
        default=None, description="instances > 1: the instances behind the balancer"
    )

    @field_validator("errors", mode="before")
    @classmethod
    def _legacy_errors(cls, value: object) -> object:
        return [Problem.legacy(item) for item in value] if isinstance(value, list) else value


class InstanceSet(BaseModel):
    """An endpoint of several vLLM instances behind one balancer (docs/instances.md): the
    endpoint's own decisions are the balancer's port and host and the union of the members'
    CPUs and nodes; each member is a whole instance's decisions, on a loopback port."""

    model_config = ConfigDict(frozen=True)

    requested: int | str = Field(description='the endpoint file\'s instances: N or "auto"')
    placement: Literal["socket", "host"]
    count: int
    min_ready: int = Field(description="instances that must pass the health gate")
    balancer: Literal["haproxy"] = "haproxy"
    reasons: list[str] = Field(description="why this many instances")
    members: list[EndpointDecisions]


class Plan(EndpointDecisions):
    units: dict[str, str] = Field(description="unit file name -> exact text")
    unit_dirs: dict[str, str] = Field(
        default_factory=dict, description="unit file name -> the folder it is installed in"
    )
    fingerprint: str = Field(description="over the units and every input that shaped them")
    inputs_fingerprint: str = Field(
        default="", description="over the shaping inputs only: what drift compares"
    )


EndpointDecisions.model_rebuild()


class RenderedUnits(NamedTuple):
    """The units rendered from one endpoint's decisions."""

    units: dict[str, str]
    """unit file name -> exact text"""
    unit_dirs: dict[str, str]
    """unit file name -> the folder it is installed in"""


UnitRenderer = Callable[[EndpointDecisions, Path, Path], RenderedUnits]
"""(decisions, unit folder, Quadlet folder) -> the units. The planner is given one
(`epycd.render.render_for_plan`) by the layer above, so the plan layer never imports the
renderer that sits on top of it."""
