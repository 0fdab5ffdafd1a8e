"""The host facts every later stage plans from (docs/architecture.md, "Host facts").

These models are the contract between host detection and the planner; `detect --json`
prints `HostFacts.model_dump(mode="json")`, whose top-level keys are fixed (same section).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

EpycGeneration = Literal[
    "Naples",
    "Rome",
    "Milan",
    "Genoa",
    "Bergamo",
    "Siena",
    "Turin",
    "Venice",
    "EPYC 4004",
    "EPYC 4005",
    "unknown",
]

SUPPORTED_GENERATIONS: frozenset[str] = frozenset({"Genoa", "Turin", "Venice"})


class NumaNode(BaseModel):
    """One NUMA node, from `sys/devices/system/node/nodeN/`."""

    node: int
    cpus: list[int] = Field(description="online logical CPUs of this node")
    memory_total_bytes: int = Field(description="MemTotal of the node's own meminfo")
    memory_available_bytes: int = Field(
        description="MemFree + Active(file) + Inactive(file) + SReclaimable, as vLLM counts it"
    )
    distances: list[int] = Field(default_factory=list)


class SocketTopology(BaseModel):
    """One CPU package. The first five fields are the `socket_topology` contract."""

    socket: int
    physical_cpus: str = Field(description="CPU list string: the first thread of each core")
    logical_cpus: str = Field(description="CPU list string: every online thread")
    numa_nodes: list[int]
    memory_gb: float = Field(description="sum of the socket's nodes' MemTotal, GiB")
    memory_available_gb: float = Field(description="sum of the nodes' available memory, GiB")
    physical_cores: int
    smt_siblings: dict[int, list[int]] = Field(
        default_factory=dict, description="first thread of a core -> its other threads"
    )
    l3_groups: list[str] = Field(default_factory=list, description="CPU lists sharing one L3")
    nps: int = Field(description="NUMA nodes per socket (1, 2 or 4; memory-less nodes count)")


class PodmanFacts(BaseModel):
    present: bool
    version: str | None = None
    rootful: bool | None = None
    quadlet: bool = Field(default=False, description="podman >= 4.4 ships Quadlet")
    notify_healthy: bool = Field(default=False, description="Notify=healthy needs podman >= 5.0")


class DockerFacts(BaseModel):
    present: bool
    version: str | None = None
    daemon_reachable: bool = False


class PythonHeaders(BaseModel):
    """The C headers (Python.h) of the interpreter that serves a host vLLM: torch's inductor
    compiles its C++ kernels against them (docs/tuning.md rule 4). Read from the files under
    the host root by `epycd.host.pyheaders`, never by running the interpreter."""

    vllm: str = Field(description="the vllm executable, as the host names it")
    interpreter: str | None = Field(
        default=None,
        description="the interpreter that runs it (a venv's base interpreter), as the host "
        "names it",
    )
    prefix: str | None = Field(default=None, description="that interpreter's installation prefix")
    version: str | None = Field(default=None, description="its Python version, e.g. 3.11")
    header: str | None = Field(
        default=None, description="Python.h as found, or where it was looked for"
    )
    present: bool | None = Field(
        default=None, description="None: not known (the interpreter could not be told)"
    )
    note: str | None = Field(default=None, description="why it is not known")


class HostVllmFacts(BaseModel):
    """A host (venv/conda) vLLM, probed by running its own interpreter."""

    path: str
    present: bool
    version: str | None = None
    platform: str | None = Field(
        default=None, description="vllm.platforms.current_platform class, e.g. ZenCpuPlatform"
    )
    zentorch_version: str | None = Field(
        default=None,
        description="the env's zentorch distribution, None when none is installed or the probe "
        "did not ask (a probe from before this field)",
    )
    error: str | None = None
    python_headers: PythonHeaders | None = Field(
        default=None,
        description="the serving interpreter's Python.h, read under the host root (not probed, "
        "not cached: headers come and go without the venv changing)",
    )


class ServerFacts(BaseModel):
    """An engine's server executable, asked its version (its package's host facts)."""

    path: str
    present: bool
    version: str | None = Field(default=None, description="its --version line, e.g. 0.5.0-dev")
    error: str | None = None


class RuntimeFacts(BaseModel):
    podman: PodmanFacts = PodmanFacts(present=False)
    docker: DockerFacts = DockerFacts(present=False)
    vllm: HostVllmFacts | None = None
    servers: dict[str, ServerFacts] = Field(
        default_factory=dict,
        description="engine -> its own runtime's server, where it was built and an endpoint "
        "file of that engine asks for it (`EnginePlanner.with_runtime`)",
    )


class GpuFacts(BaseModel):
    """One AMD GPU (a KFD topology node with SIMDs), read by `epycd.host.gpus`."""

    index: int = Field(description="the GPU's index as HIP_VISIBLE_DEVICES counts it")
    gfx_version: str = Field(description="gfx target, e.g. gfx942")
    product: str = Field(description="product name(s) of the gfx target, or amd-smi's")
    vram_gb: float = Field(description="VRAM, GiB")
    numa_node: int | None = Field(description="the PCI device's NUMA node; None if unknown")
    pci: str = Field(description="PCI address DOMAIN:BUS:DEV.FN")
    render_minor: int | None = Field(default=None, description="/dev/dri/renderD<minor>")


class HostFacts(BaseModel):
    """Everything detection knows about one host. Read from a root folder, never mutated."""

    cpu_model: str
    vendor: str
    cpu_family: int | None
    cpu_model_number: int | None
    cpu_stepping: int | None = None
    is_amd_epyc: bool
    epyc_generation: EpycGeneration
    zen_arch: str | None
    is_supported_epyc: bool
    avx512: bool
    avx512_bf16: bool
    logical_cores: int
    physical_cores: int
    sockets: int
    threads_per_core: int
    numa_nodes: int
    memory_gb: float = Field(description="MemTotal of /proc/meminfo, GiB")
    socket_topology: list[SocketTopology]
    nodes: list[NumaNode]
    offline_cpus: str = ""
    flags: list[str] = Field(default_factory=list)
    socket_busy_pct: dict[int, float] = Field(
        default_factory=dict, description="per socket, from two proc/stat samples"
    )
    runtimes: RuntimeFacts = RuntimeFacts()
    cxx_compiler: str | None = Field(
        default=None,
        description="g++/c++ on systemd's default PATH (a host vLLM's start compiles with it)",
    )
    warnings: list[str] = Field(default_factory=list)
    gpus: list[GpuFacts] = Field(
        default_factory=list, description="AMD GPUs from the KFD topology (epycd.host.gpus)"
    )
    rocm_version: str | None = Field(default=None, description="opt/rocm/.info/version")

    def socket(self, index: int) -> SocketTopology:
        for sock in self.socket_topology:
            if sock.socket == index:
                return sock
        raise KeyError(index)

    def node(self, index: int) -> NumaNode:
        for node in self.nodes:
            if node.node == index:
                return node
        raise KeyError(index)
