"""Host detection: the files under a root folder -> `HostFacts`.

Required: proc/cpuinfo, proc/meminfo, sys/devices/system/cpu/online (missing or unreadable
is an `InputError` naming the file). Everything else has a fallback that keeps the facts
right and, where it changes an answer, adds a warning.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

from epycd.host.cpuinfo import CpuIdentity, parse_cores, parse_identity
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import GpuFacts, HostFacts, NumaNode, RuntimeFacts, SocketTopology
from epycd.host.files import SYSTEMD_DEFAULT_PATH, parsed, read_optional, read_required
from epycd.host.generation import Generation, classify, is_amd_epyc, is_supported
from epycd.host.gpus import read_gpus, read_rocm_version, run_amd_smi
from epycd.host.load import sample_socket_busy
from epycd.host.memory import Memory, memory_of, parse_meminfo
from epycd.host.numa import read_nodes
from epycd.host.sockets import build_sockets
from epycd.host.topology import CPU_DIR, Core, CpuPlace, cores_of, read_places
from epycd.sizes import gib

CPUINFO = "proc/cpuinfo"
MEMINFO = "proc/meminfo"
ONLINE = f"{CPU_DIR}/online"
OFFLINE = f"{CPU_DIR}/offline"


def socket_cpus(sockets: list[SocketTopology]) -> dict[int, list[int]]:
    """Socket -> its online logical CPUs, the shape `sample_socket_busy` takes."""
    return {sock.socket: parse_cpulist(sock.logical_cpus) for sock in sockets}


@dataclass(frozen=True)
class Layout:
    """Where the online CPUs sit: their places, cores, NUMA nodes and sockets."""

    places: list[CpuPlace]
    cores: list[Core]
    nodes: list[NumaNode]
    sockets: list[SocketTopology]
    offline: list[int]


def read_layout(root: Path, cpuinfo_text: str, memory: Memory, warnings: list[str]) -> Layout:
    online = parsed(root, ONLINE, read_required(root, ONLINE), parse_cpulist)
    offline_text = read_optional(root, OFFLINE)
    offline = parsed(root, OFFLINE, offline_text, parse_cpulist) if offline_text else []
    places, incomplete = read_places(
        root, online, functools.cache(lambda: parse_cores(cpuinfo_text))
    )
    if incomplete:
        warnings.append(
            f"no sysfs topology for CPUs {format_cpulist(incomplete)}: "
            "placed by /proc/cpuinfo or as single cores"
        )
    cores = cores_of(places)
    nodes = read_nodes(root, online, memory, warnings)
    return Layout(places, cores, nodes, build_sockets(places, cores, nodes, warnings), offline)


def probed_runtimes(root: Path, vllm: str | None, *, probe_runtimes: bool) -> RuntimeFacts:
    """podman and docker of this machine (when asked), and a given vllm executable with the
    Python headers of its interpreter on the host at `root`."""
    if not (probe_runtimes or vllm):
        return RuntimeFacts()
    from epycd.host import runtimes as probes
    from epycd.host.pyheaders import with_python_headers

    found = probes.probe_runtimes(vllm) if probe_runtimes else probes.only_vllm(vllm)
    if found.vllm is None:
        return found
    return found.model_copy(update={"vllm": with_python_headers(found.vllm, root)})


def detect_host(
    root: Path,
    *,
    vllm: str | None = None,
    load_sample_seconds: float | None = None,
    probe_runtimes: bool = True,
) -> HostFacts:
    """Facts of the host described by `root` (`/` for this machine).

    `load_sample_seconds` None skips the two proc/stat samples (busy % stays empty);
    `probe_runtimes` asks podman and docker of the machine this process runs on; a given
    `vllm` executable is probed either way (it was asked for by path).
    """
    warnings: list[str] = []
    cpuinfo_text = read_required(root, CPUINFO)
    identity = parsed(root, CPUINFO, cpuinfo_text, parse_identity)
    host_memory = memory_of(parsed(root, MEMINFO, read_required(root, MEMINFO), parse_meminfo))
    layout = read_layout(root, cpuinfo_text, host_memory, warnings)
    generation, generation_warnings = classify(
        identity.vendor, identity.model_name, identity.family, identity.model
    )
    warnings.extend(generation_warnings)
    busy = (
        sample_socket_busy(root, socket_cpus(layout.sockets), load_sample_seconds)
        if load_sample_seconds is not None
        else {}
    )
    software = probe_software(root, vllm, probe_runtimes=probe_runtimes)
    return _host_facts(identity, generation, layout, host_memory, busy, software, warnings)


@dataclass(frozen=True)
class Software:
    """What the host offers to run vLLM with: runtimes, a C++ compiler, GPUs and ROCm."""

    runtimes: RuntimeFacts
    cxx_compiler: str | None
    gpus: list[GpuFacts]
    rocm_version: str | None


def probe_software(root: Path, vllm: str | None, *, probe_runtimes: bool) -> Software:
    """`probe_runtimes` also asks amd-smi of the machine this process runs on."""
    return Software(
        runtimes=probed_runtimes(root, vllm, probe_runtimes=probe_runtimes),
        cxx_compiler=find_cxx(root),
        gpus=read_gpus(root, run_amd_smi() if probe_runtimes else None),
        rocm_version=read_rocm_version(root),
    )


def _host_facts(
    identity: CpuIdentity,
    generation: Generation,
    layout: Layout,
    host_memory: Memory,
    busy: dict[int, float],
    software: Software,
    warnings: list[str],
) -> HostFacts:
    flags = set(identity.flags)
    return HostFacts(
        cpu_model=identity.model_name,
        vendor=identity.vendor,
        cpu_family=identity.family,
        cpu_model_number=identity.model,
        cpu_stepping=identity.stepping,
        is_amd_epyc=is_amd_epyc(identity.vendor, identity.model_name),
        epyc_generation=generation.generation,
        zen_arch=generation.zen_arch,
        is_supported_epyc=is_supported(generation.generation),
        avx512="avx512f" in flags,
        avx512_bf16="avx512_bf16" in flags,
        logical_cores=len(layout.places),
        physical_cores=len(layout.cores),
        sockets=len(layout.sockets),
        threads_per_core=max((len(core.threads) for core in layout.cores), default=1),
        numa_nodes=len(layout.nodes),
        memory_gb=gib(host_memory.total_bytes),
        socket_topology=layout.sockets,
        nodes=layout.nodes,
        offline_cpus=format_cpulist(layout.offline),
        flags=identity.flags,
        socket_busy_pct=busy,
        runtimes=software.runtimes,
        cxx_compiler=software.cxx_compiler,
        warnings=warnings,
        gpus=software.gpus,
        rocm_version=software.rocm_version,
    )


CXX_NAMES = ("g++", "c++")


def find_cxx(root: Path) -> str | None:
    """The C++ compiler a service of the host at `root` would find (docs/tuning.md rule 4),
    as a path inside that host; None when there is none."""
    for folder in SYSTEMD_DEFAULT_PATH.split(":"):
        for name in CXX_NAMES:
            found = shutil.which(name, path=str(root / folder.lstrip("/")))
            if found:
                return str(Path("/") / Path(found).relative_to(root))
    return None
