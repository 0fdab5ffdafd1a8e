"""Fake host roots: folders of proc/ and sys/ files describing any CPU/NUMA shape.

A dual-socket EPYC cannot exist on the test machine, so its /proc and /sys are written to
a folder and `detect_host(root)` reads them as it reads `/`.

Use:
    root = make_host(tmp_path, "genoa-9654-2s-nps4")      # a catalogue shape
    root = write_host(tmp_path / "x", HostShape(...))       # any shape
    shape = CATALOGUE["genoa-9654-2s-nps4"]                 # the description itself

Conventions (modelled on Linux on AMD and Intel servers):
- Logical CPUs are numbered thread-major: every core's first thread socket by socket,
  then the second threads in the same order. Logical index i is thread
  `i // (sockets * cores_per_socket)` of core `i % cores_per_socket` of socket
  `(i // cores_per_socket) % sockets`; CPU numbers are handed out in ascending order,
  skipping `missing_cpu_numbers` (gaps in every CPU list).
- core_id is the core's index within its socket; nodes split a socket's cores evenly
  (`nps` per socket, numbered socket by socket); an L3 group is `l3_cores` consecutive
  cores of a socket with all their threads.
- Offline CPUs (`offline_cpus`, CPU numbers) appear in cpu/offline only: not in
  cpu/online, /proc/cpuinfo, node cpulists, and they have no topology folder.
- Node meminfo: MemTotal as given; the four parts vLLM counts as available are fixed
  fractions of it (`AVAILABLE_PARTS`), so node available = MemTotal * sum(fractions).
- /proc/meminfo MemTotal: `host_memtotal_gib` when set (VMs whose nodes show less than
  MemTotal, like the test machine), else the sum of all nodes.
- usr/bin/g++ is an executable stub unless `cxx=False` (a minimal Debian without one).
- Pythons and host vLLMs are added apart (`write_python`, `write_venv_vllm`,
  `write_vllm_script`): an interpreter stub, its include/python3.X/Python.h unless
  `headers=False` (Debian without python3.X-dev), a venv's pyvenv.cfg and bin/ links, and a
  `vllm` script with pip's shebang; links are absolute host paths, as on a real host.
- GPUs (`gpus`, `FakeGpu`): a KFD topology node per GPU after the CPU nodes
  (sys/class/kfd/kfd/topology/nodes/N/properties in amdkfd's `name value` format, with a
  mem_banks/0 VRAM heap), a DRM card per GPU (sys/class/drm/cardK/device/ with
  mem_info_vram_total, numa_node and uevent's PCI_SLOT_NAME), PCI bus 0x05 + 0x10 * index
  in domain 0, and opt/rocm/.info/version when `rocm_version` is set. See epycd/host/gpus.py
  for the kernel sources of these formats.
- Distances: 10 local, 12 between nodes of one socket, 32 across sockets; a memory-only
  node is 20 from the nodes of its `near_socket` and 40 from the others.

This module is shared by several test areas: keep names and conventions stable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

KIB_PER_GIB = 1024 * 1024

AVAILABLE_PARTS: dict[str, float] = {
    "MemFree": 0.80,
    "Active(file)": 0.02,
    "Inactive(file)": 0.03,
    "SReclaimable": 0.01,
}
"""Fractions of a node's MemTotal written as the parts vLLM counts as available."""

BASE_FLAGS = (
    "fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "sep", "mtrr", "pge",
    "mca", "cmov", "pat", "pse36", "clflush", "mmx", "fxsr", "sse", "sse2", "ht", "syscall",
    "nx", "pdpe1gb", "rdtscp", "lm", "constant_tsc", "rep_good", "nopl", "xtopology",
    "nonstop_tsc", "cpuid", "pni", "pclmulqdq", "ssse3", "fma", "cx16", "pcid", "sse4_1",
    "sse4_2", "x2apic", "movbe", "popcnt", "aes", "xsave", "avx", "f16c", "rdrand", "lahf_lm",
    "abm", "bmi1", "avx2", "smep", "bmi2", "erms", "invpcid", "rdseed", "adx", "smap",
    "clflushopt", "clwb", "sha_ni", "xsaveopt", "xsavec", "xgetbv1", "xsaves",
)  # fmt: skip
ZEN3_FLAGS = (*BASE_FLAGS, "sse4a", "topoext", "clzero", "vaes", "vpclmulqdq")
ZEN4_FLAGS = (
    *ZEN3_FLAGS,
    "avx512f", "avx512dq", "avx512ifma", "avx512cd", "avx512bw", "avx512vl", "avx512_bf16",
    "avx512vbmi", "avx512_vbmi2", "gfni", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq",
)  # fmt: skip
ZEN5_FLAGS = (*ZEN4_FLAGS, "avx_vnni", "avx512_vp2intersect", "movdiri", "movdir64b")
SAPPHIRE_RAPIDS_FLAGS = (
    *BASE_FLAGS,
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16",
    "amx_bf16", "amx_tile", "amx_int8",
)  # fmt: skip


@dataclass(frozen=True)
class MemoryOnlyNode:
    """A node with memory and no CPUs (CXL expander, HBM), near one socket."""

    near_socket: int
    memory_gib: float


@dataclass(frozen=True)
class FakeGpu:
    """One AMD GPU on a NUMA node: gfx_target_version as KFD writes it (90402 = gfx942)."""

    gfx_target_version: int
    vram_gib: int
    numa_node: int
    device_id: int = 0x74A1


MI300X = (90402, 192, 0x74A1)
MI355X = (90500, 288, 0x75A3)
MI210 = (90010, 64, 0x740F)


def gpus_on_nodes(kind: tuple[int, int, int], nodes: list[int]) -> tuple[FakeGpu, ...]:
    target, vram, device = kind
    return tuple(FakeGpu(target, vram, node, device) for node in nodes)


@dataclass(frozen=True)
class HostShape:
    cpu_name: str
    family: int
    model: int
    flags: tuple[str, ...]
    cores_per_socket: int
    sockets: int = 1
    threads_per_core: int = 1
    nps: int = 1
    node_memory_gib: float = 64.0
    vendor: str = "AuthenticAMD"
    stepping: int = 1
    l3_cores: int = 8
    offline_cpus: frozenset[int] = frozenset()
    missing_cpu_numbers: frozenset[int] = frozenset()
    memoryless_nodes: frozenset[int] = frozenset()
    memory_only_nodes: tuple[MemoryOnlyNode, ...] = ()
    node_dir: bool = True
    host_memtotal_gib: float | None = None
    node_memory_overrides: Mapping[int, float] = field(default_factory=dict)
    cxx: bool = True
    """usr/bin/g++ present (an executable stub): a host vLLM's start compiles with it."""
    gpus: tuple[FakeGpu, ...] = ()
    rocm_version: str | None = None

    @property
    def logical_count(self) -> int:
        """CPUs that exist, online or not."""
        return self.sockets * self.cores_per_socket * self.threads_per_core

    @property
    def cpu_nodes(self) -> int:
        return self.sockets * self.nps

    def cpu_numbers(self) -> list[int]:
        """CPU number of each logical index."""
        numbers: list[int] = []
        candidate = 0
        while len(numbers) < self.logical_count:
            if candidate not in self.missing_cpu_numbers:
                numbers.append(candidate)
            candidate += 1
        return numbers

    def place(self, index: int) -> tuple[int, int, int]:
        """(socket, core within socket, thread) of a logical index."""
        per_thread = self.sockets * self.cores_per_socket
        thread, rest = divmod(index, per_thread)
        socket, core = divmod(rest, self.cores_per_socket)
        return socket, core, thread

    def node_of(self, socket: int, core: int) -> int:
        return socket * self.nps + core * self.nps // self.cores_per_socket

    def node_memory_kib(self, node: int) -> int:
        if node in self.memoryless_nodes:
            return 0
        if node >= self.cpu_nodes:
            gib = self.memory_only_nodes[node - self.cpu_nodes].memory_gib
        else:
            gib = self.node_memory_overrides.get(node, self.node_memory_gib)
        return int(gib * KIB_PER_GIB)


def _cpuinfo_block(shape: HostShape, cpu: int, socket: int, core: int) -> str:
    siblings = shape.cores_per_socket * shape.threads_per_core
    return "\n".join(
        [
            f"processor\t: {cpu}",
            f"vendor_id\t: {shape.vendor}",
            f"cpu family\t: {shape.family}",
            f"model\t\t: {shape.model}",
            f"model name\t: {shape.cpu_name}",
            f"stepping\t: {shape.stepping}",
            "cpu MHz\t\t: 2400.000",
            f"physical id\t: {socket}",
            f"siblings\t: {siblings}",
            f"core id\t\t: {core}",
            f"cpu cores\t: {shape.cores_per_socket}",
            f"flags\t\t: {' '.join(shape.flags)}",
            "bogomips\t: 4800.00",
            "",
            "",
        ]
    )


def _cpulist(cpus: list[int]) -> str:
    """Written independently of epycd's formatter, so the two check each other."""
    ordered = sorted(cpus)
    parts: list[str] = []
    start = prev = None
    for cpu in ordered:
        if start is None:
            start = prev = cpu
        elif prev is not None and cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def _meminfo(kib_total: int, prefix: str = "") -> str:
    parts = {key: int(kib_total * fraction) for key, fraction in AVAILABLE_PARTS.items()}
    lines = [f"{prefix}MemTotal:       {kib_total} kB"]
    lines.append(f"{prefix}MemFree:        {parts['MemFree']} kB")
    if not prefix:
        lines.append(f"MemAvailable:   {int(kib_total * 0.9)} kB")
        lines.append("Buffers:        1024 kB")
    lines.append(f"{prefix}Active:         {parts['Active(file)'] + 2048} kB")
    lines.append(f"{prefix}Active(anon):   2048 kB")
    lines.append(f"{prefix}Active(file):   {parts['Active(file)']} kB")
    lines.append(f"{prefix}Inactive(file): {parts['Inactive(file)']} kB")
    lines.append(f"{prefix}SReclaimable:   {parts['SReclaimable']} kB")
    lines.append(f"{prefix}SUnreclaim:     4096 kB")
    lines.append(f"{prefix}HugePages_Total:     0")
    return "\n".join(lines) + "\n"


def expected_available_kib(total_kib: int) -> int:
    """What a node meminfo written here adds up to under vLLM's available rule."""
    return sum(int(total_kib * fraction) for fraction in AVAILABLE_PARTS.values())


def _write(path: Path, text: str, made: set[str] | None = None) -> None:
    """Write a file, creating its folder; `made` remembers folders within one host write."""
    parent = os.path.dirname(path)
    if made is None or parent not in made:
        os.makedirs(parent, exist_ok=True)
        if made is not None:
            made.add(parent)
    with open(path, "w") as file:
        file.write(text)


def _distance(shape: HostShape, a: int, b: int) -> int:
    if a == b:
        return 10
    extra = {shape.cpu_nodes + i: n.near_socket for i, n in enumerate(shape.memory_only_nodes)}
    if a in extra or b in extra:
        memory_node, other = (a, b) if a in extra else (b, a)
        if other in extra:
            return 40
        return 20 if other // shape.nps == extra[memory_node] else 40
    return 12 if a // shape.nps == b // shape.nps else 32


def write_proc_stat(root: Path, times: Mapping[int, tuple[int, int, int, int]]) -> None:
    """proc/stat with per-CPU (user, system, idle, iowait) jiffies."""
    lines = []
    total = [sum(t[i] for t in times.values()) for i in range(4)]
    lines.append(f"cpu  {total[0]} 0 {total[1]} {total[2]} {total[3]} 0 0 0 0 0")
    for cpu in sorted(times):
        user, system, idle, iowait = times[cpu]
        lines.append(f"cpu{cpu} {user} 0 {system} {idle} {iowait} 0 0 0 0 0")
    lines += ["intr 0", "ctxt 0", "btime 0", "processes 1"]
    _write(root / "proc/stat", "\n".join(lines) + "\n")


def write_host(root: Path, shape: HostShape) -> Path:
    """Write `shape` as a host root at `root`; returns `root`."""
    cpu_dir = root / "sys/devices/system/cpu"
    made: set[str] = set()
    numbers = shape.cpu_numbers()
    online = [cpu for cpu in numbers if cpu not in shape.offline_cpus]
    by_core: dict[tuple[int, int], list[int]] = {}
    node_cpus: dict[int, list[int]] = {node: [] for node in range(shape.cpu_nodes)}
    blocks: list[str] = []
    for index, cpu in enumerate(numbers):
        socket, core, _thread = shape.place(index)
        by_core.setdefault((socket, core), []).append(cpu)
        if cpu in shape.offline_cpus:
            continue
        node_cpus[shape.node_of(socket, core)].append(cpu)
    l3_of: dict[tuple[int, int], list[int]] = {}
    for (socket, core), cpus in by_core.items():
        group = l3_of.setdefault((socket, core // shape.l3_cores), [])
        group.extend(cpu for cpu in cpus if cpu not in shape.offline_cpus)
    for index, cpu in sorted(enumerate(numbers), key=lambda item: item[1]):
        if cpu in shape.offline_cpus:
            continue
        socket, core, _thread = shape.place(index)
        blocks.append(_cpuinfo_block(shape, cpu, socket, core))
        siblings = [c for c in by_core[(socket, core)] if c not in shape.offline_cpus]
        l3 = l3_of[(socket, core // shape.l3_cores)]
        base = cpu_dir / f"cpu{cpu}"
        _write(base / "topology/physical_package_id", f"{socket}\n", made)
        _write(base / "topology/core_id", f"{core}\n", made)
        _write(base / "topology/thread_siblings_list", _cpulist(siblings) + "\n", made)
        _write(base / "cache/index3/shared_cpu_list", _cpulist(l3) + "\n", made)
        _write(base / "cache/index3/level", "3\n", made)
    for cpu in shape.offline_cpus:
        (cpu_dir / f"cpu{cpu}").mkdir(parents=True, exist_ok=True)
        _write(cpu_dir / f"cpu{cpu}/online", "0\n")
    _write(root / "proc/cpuinfo", "".join(blocks))
    _write(cpu_dir / "online", _cpulist(online) + "\n")
    _write(cpu_dir / "offline", _cpulist(sorted(shape.offline_cpus)) + "\n")
    _write(cpu_dir / "possible", _cpulist(numbers) + "\n")
    _write(cpu_dir / "present", _cpulist(numbers) + "\n")

    all_nodes = list(range(shape.cpu_nodes + len(shape.memory_only_nodes)))
    node_kib = {node: shape.node_memory_kib(node) for node in all_nodes}
    if shape.node_dir:
        node_dir = root / "sys/devices/system/node"
        _write(node_dir / "online", _cpulist(all_nodes) + "\n")
        _write(node_dir / "possible", _cpulist(all_nodes) + "\n")
        for node in all_nodes:
            _write(node_dir / f"node{node}/cpulist", _cpulist(node_cpus.get(node, [])) + "\n")
            _write(node_dir / f"node{node}/meminfo", _meminfo(node_kib[node], f"Node {node} "))
            distances = " ".join(str(_distance(shape, node, other)) for other in all_nodes)
            _write(node_dir / f"node{node}/distance", distances + "\n")
    host_kib = (
        int(shape.host_memtotal_gib * KIB_PER_GIB)
        if shape.host_memtotal_gib is not None
        else sum(node_kib.values())
    )
    _write(root / "proc/meminfo", _meminfo(host_kib))
    write_proc_stat(root, {cpu: (100, 50, 1000, 10) for cpu in online})
    write_gpus(root, shape)
    if shape.cxx:
        _write(root / "usr/bin/g++", "#!/bin/sh\nexit 1\n")
        (root / "usr/bin/g++").chmod(0o755)
    return root


GIB_BYTES = 1024**3


def _gpu_properties(shape: HostShape, index: int, gpu: FakeGpu) -> str:
    bus = 0x05 + 0x10 * index
    props = {
        "cpu_cores_count": 0,
        "simd_count": 1216,
        "mem_banks_count": 1,
        "caches_count": 0,
        "io_links_count": 1,
        "gfx_target_version": gpu.gfx_target_version,
        "vendor_id": 0x1002,
        "device_id": gpu.device_id,
        "location_id": bus << 8,
        "domain": 0,
        "drm_render_minor": 128 + index,
        "num_xcc": 8,
    }
    return "".join(f"{name} {value}\n" for name, value in props.items())


def write_gpus(root: Path, shape: HostShape) -> None:
    """The KFD topology (CPU nodes first, as amdkfd lists them), DRM cards, ROCm version."""
    if not shape.gpus:
        return
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    for node in range(shape.cpu_nodes):
        cores = len([1 for i in range(shape.logical_count) if _node_of_index(shape, i) == node])
        _write(nodes / f"{node}/properties", f"cpu_cores_count {cores}\nsimd_count 0\n")
    for index, gpu in enumerate(shape.gpus):
        gpu_node = nodes / str(shape.cpu_nodes + index)
        _write(gpu_node / "properties", _gpu_properties(shape, index, gpu))
        vram = gpu.vram_gib * GIB_BYTES
        _write(gpu_node / "mem_banks/0/properties", f"heap_type 1\nsize_in_bytes {vram}\n")
        card = root / f"sys/class/drm/card{index}/device"
        pci = f"0000:{0x05 + 0x10 * index:02x}:00.0"
        _write(card / "uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={pci}\n")
        _write(card / "mem_info_vram_total", f"{vram}\n")
        _write(card / "numa_node", f"{gpu.numa_node}\n")
    if shape.rocm_version:
        _write(root / "opt/rocm/.info/version", shape.rocm_version + "\n")


def _node_of_index(shape: HostShape, index: int) -> int:
    socket, core, _thread = shape.place(index)
    return shape.node_of(socket, core)


def _vm(name: str, family: int, model: int, flags: tuple[str, ...], cores: int) -> HostShape:
    return HostShape(
        cpu_name=name,
        family=family,
        model=model,
        flags=(*flags, "hypervisor"),
        cores_per_socket=cores,
        node_memory_gib=10.8,
        host_memtotal_gib=23.5,
    )


CATALOGUE: dict[str, HostShape] = {
    # The machine host detection was first written on: a Turin VM with no model number in its name.
    "vm-zen5": _vm("AMD EPYC", 26, 2, ZEN5_FLAGS, 2),
    # The same with its node's meminfo at the host's 23.5 GiB: room for two small instances.
    "vm-zen5-24g": replace(_vm("AMD EPYC", 26, 2, ZEN5_FLAGS, 2), node_memory_gib=23.5),
    # The machine the tests were first run on: a Genoa VM, same naming.
    "this-machine-genoa-vm": _vm("AMD EPYC", 25, 17, ZEN4_FLAGS, 2),
    "genoa-9654-2s-nps1": HostShape(
        cpu_name="AMD EPYC 9654 96-Core Processor",
        family=25, model=17, flags=ZEN4_FLAGS,
        sockets=2, cores_per_socket=96, threads_per_core=2, nps=1, node_memory_gib=384.0,
    ),
    "genoa-9654-2s-nps4": HostShape(
        cpu_name="AMD EPYC 9654 96-Core Processor",
        family=25, model=17, flags=ZEN4_FLAGS,
        sockets=2, cores_per_socket=96, threads_per_core=2, nps=4, node_memory_gib=96.0,
    ),
    "milan-7763-2s": HostShape(
        cpu_name="AMD EPYC 7763 64-Core Processor",
        family=25, model=1, flags=ZEN3_FLAGS,
        sockets=2, cores_per_socket=64, threads_per_core=2, nps=1, node_memory_gib=256.0,
    ),
    "bergamo-9754": HostShape(
        cpu_name="AMD EPYC 9754 128-Core Processor",
        family=25, model=0xA0, flags=ZEN4_FLAGS,
        cores_per_socket=128, threads_per_core=2, node_memory_gib=768.0,
    ),
    "epyc-4584px": HostShape(
        cpu_name="AMD EPYC 4584PX 16-Core Processor",
        family=25, model=0x61, flags=ZEN4_FLAGS,
        cores_per_socket=16, threads_per_core=2, node_memory_gib=128.0,
    ),
    "turin-9965": HostShape(
        cpu_name="AMD EPYC 9965 192-Core Processor",
        family=26, model=0x11, flags=ZEN5_FLAGS,
        sockets=2, cores_per_socket=192, threads_per_core=2, node_memory_gib=768.0,
        l3_cores=16,
    ),
    # Turin dense 2x192 with SMT off in the BIOS: one thread per core, 384 CPUs.
    "turin-9965-2s-nosmt": HostShape(
        cpu_name="AMD EPYC 9965 192-Core Processor",
        family=26, model=0x11, flags=ZEN5_FLAGS,
        sockets=2, cores_per_socket=192, threads_per_core=1, node_memory_gib=768.0,
        l3_cores=16,
    ),
    # Hypothetical part number: the 9xx6 name rule and CPUID family 0x1a model 0x90 both
    # say Venice; 256 cores per socket, 2 sockets, SMT2 = 1024 threads.
    "venice-256c": HostShape(
        cpu_name="AMD EPYC 9996 256-Core Processor",
        family=26, model=0x90, flags=ZEN5_FLAGS,
        sockets=2, cores_per_socket=256, threads_per_core=2, node_memory_gib=1024.0,
        l3_cores=32,
    ),
    "xeon": HostShape(
        cpu_name="Intel(R) Xeon(R) Platinum 8480+",
        vendor="GenuineIntel", family=6, model=143, stepping=8, flags=SAPPHIRE_RAPIDS_FLAGS,
        sockets=2, cores_per_socket=56, threads_per_core=2, node_memory_gib=512.0,
        l3_cores=56,
    ),
    # Turin 2x128 (9755) with SMT off in the BIOS: 256 CPUs, 16 L3 groups of 8 per socket.
    "turin-9755-2s-nosmt": HostShape(
        cpu_name="AMD EPYC 9755 128-Core Processor",
        family=26, model=2, flags=ZEN5_FLAGS,
        sockets=2, cores_per_socket=128, threads_per_core=1, node_memory_gib=768.0,
    ),
    # A 16-core cloud VM (one socket, one node, no SMT visible).
    "vm-16": replace(_vm("AMD EPYC", 25, 17, ZEN4_FLAGS, 16), node_memory_gib=64.0,
                     host_memtotal_gib=64.0),
    "vm-offline-cpu": replace(
        _vm("AMD EPYC", 25, 17, ZEN4_FLAGS, 4), offline_cpus=frozenset({2})
    ),
    # The benchmark's host: 2 sockets x 128 cores x 2 threads = 512 threads, NPS2.
    "bench-2s-512t": HostShape(
        cpu_name="AMD EPYC 9755 128-Core Processor",
        family=26, model=2, flags=ZEN5_FLAGS,
        sockets=2, cores_per_socket=128, threads_per_core=2, nps=2, node_memory_gib=384.0,
    ),
    # Instinct hosts (docs/instinct.md): eight MI300X, four on each socket's NUMA nodes (one per
    # node, NPS4); eight MI355X on a dual Turin (NPS1, four per socket); one MI210.
    "genoa-2s-8x-mi300x": HostShape(
        cpu_name="AMD EPYC 9654 96-Core Processor",
        family=25, model=17, flags=ZEN4_FLAGS,
        sockets=2, cores_per_socket=96, threads_per_core=2, nps=4, node_memory_gib=192.0,
        gpus=gpus_on_nodes(MI300X, [0, 1, 2, 3, 4, 5, 6, 7]), rocm_version="7.0.2-56",
    ),
    "turin-2s-8x-mi355x": HostShape(
        cpu_name="AMD EPYC 9575F 64-Core Processor",
        family=26, model=2, flags=ZEN5_FLAGS,
        sockets=2, cores_per_socket=64, threads_per_core=2, nps=1, node_memory_gib=768.0,
        gpus=gpus_on_nodes(MI355X, [0, 0, 0, 0, 1, 1, 1, 1]), rocm_version="7.0.2-56",
    ),
    "genoa-1x-mi210": HostShape(
        cpu_name="AMD EPYC 9354 32-Core Processor",
        family=25, model=17, flags=ZEN4_FLAGS,
        cores_per_socket=32, threads_per_core=2, node_memory_gib=256.0,
        gpus=gpus_on_nodes(MI210, [0]), rocm_version="6.4.1-120",
    ),
}  # fmt: skip


def make_host(dest: Path, name: str) -> Path:
    """Write the catalogue shape `name` to `dest / name`; returns that root."""
    return write_host(dest / name, CATALOGUE[name])


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


def write_python(
    root: Path, prefix: str = "/usr", version: str = "3.11", *, headers: bool = True
) -> str:
    """A Python under `root`: PREFIX/bin/python3.X (an executable stub), PREFIX/bin/python3
    linking to it, and PREFIX/include/python3.X/Python.h unless `headers=False`. Returns the
    interpreter as the host names it."""
    interpreter = f"{prefix.rstrip('/')}/bin/python{version}"
    _write(root / interpreter.lstrip("/"), "#!/bin/sh\nexit 1\n")
    (root / interpreter.lstrip("/")).chmod(0o755)
    _link(root / prefix.lstrip("/") / "bin" / "python3", f"python{version}")
    header = root / prefix.lstrip("/") / "include" / f"python{version}" / "Python.h"
    if headers:
        _write(header, "/* Python.h */\n")
    elif header.exists():
        header.unlink()
    return interpreter


def write_vllm_script(root: Path, vllm: str, shebang: str) -> str:
    """A `vllm` console script at the host path `vllm`, as pip writes it (`shebang` is the
    whole first line's interpreter part, e.g. `/opt/venv/bin/python3`)."""
    script = root / vllm.lstrip("/")
    _write(script, f"#!{shebang}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n")
    script.chmod(0o755)
    return vllm


def write_venv_vllm(
    root: Path,
    venv: str = "/opt/epyc-llm/runtime",
    base: str = "/usr/bin/python3.11",
    *,
    cfg_version: str = "version = 3.11.2",
    executable: bool = True,
) -> str:
    """A venv at the host path `venv` made from the interpreter `base` (venv's layout:
    pyvenv.cfg with `home`, `cfg_version` and, unless `executable=False` as virtualenv and
    Python < 3.11 write it, `executable`; bin/python3 linking to `base`), with pip's `vllm`
    script. Returns the vllm as the host names it."""
    home = base.rsplit("/", 1)[0]
    folder = root / venv.lstrip("/")
    cfg = f"home = {home}\ninclude-system-site-packages = false\n{cfg_version}\n"
    if executable:
        cfg += f"executable = {base}\ncommand = {base} -m venv {venv}\n"
    _write(folder / "pyvenv.cfg", cfg)
    _link(folder / "bin" / "python3", base)
    _link(folder / "bin" / "python", "python3")
    return write_vllm_script(root, f"{venv}/bin/vllm", f"{venv}/bin/python3")
