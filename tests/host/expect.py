"""Expected facts of a fake host, derived from its shape's fields with code of its own
(not the generator's helpers and not epycd's), so that the three check each other."""

from __future__ import annotations

from itertools import count

from tests.hosts import AVAILABLE_PARTS, HostShape

GIB_KIB = 1024 * 1024


def cpu_numbers(shape: HostShape) -> list[int]:
    total = shape.sockets * shape.cores_per_socket * shape.threads_per_core
    numbers = (n for n in count() if n not in shape.missing_cpu_numbers)
    return [next(numbers) for _ in range(total)]


def core_threads(
    shape: HostShape, socket: int, core: int, numbers: list[int] | None = None
) -> list[int]:
    """Online threads of one core: thread t of core c of socket s has logical index
    t * sockets * cores + s * cores + c (first threads socket by socket, then siblings)."""
    numbers = numbers if numbers is not None else cpu_numbers(shape)
    per_thread = shape.sockets * shape.cores_per_socket
    threads = [
        numbers[t * per_thread + socket * shape.cores_per_socket + core]
        for t in range(shape.threads_per_core)
    ]
    return sorted(cpu for cpu in threads if cpu not in shape.offline_cpus)


def cpulist(cpus: list[int]) -> str:
    """Naive formatter: a run is kept while the next number is one more."""
    out: list[list[int]] = []
    for cpu in sorted(cpus):
        if out and out[-1][-1] + 1 == cpu:
            out[-1].append(cpu)
        else:
            out.append([cpu])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def physical_cpus(shape: HostShape, socket: int) -> list[int]:
    firsts = []
    numbers = cpu_numbers(shape)
    for core in range(shape.cores_per_socket):
        threads = core_threads(shape, socket, core, numbers)
        if threads:
            firsts.append(threads[0])
    return firsts


def logical_cpus(shape: HostShape, socket: int) -> list[int]:
    numbers = cpu_numbers(shape)
    return sorted(
        cpu
        for core in range(shape.cores_per_socket)
        for cpu in core_threads(shape, socket, core, numbers)
    )


def socket_nodes(shape: HostShape, socket: int) -> list[int]:
    if not shape.node_dir:
        return [0]
    own = list(range(socket * shape.nps, (socket + 1) * shape.nps))
    first_extra = shape.sockets * shape.nps
    extra = [
        first_extra + i for i, n in enumerate(shape.memory_only_nodes) if n.near_socket == socket
    ]
    return own + extra


def node_gib(shape: HostShape, node: int) -> float:
    if node in shape.memoryless_nodes:
        return 0.0
    first_extra = shape.sockets * shape.nps
    if node >= first_extra:
        return shape.memory_only_nodes[node - first_extra].memory_gib
    return shape.node_memory_overrides.get(node, shape.node_memory_gib)


def node_total_kib(shape: HostShape, node: int) -> int:
    return int(node_gib(shape, node) * GIB_KIB)


def node_available_kib(shape: HostShape, node: int) -> int:
    total = node_total_kib(shape, node)
    return sum(int(total * fraction) for fraction in AVAILABLE_PARTS.values())


def socket_memory_gib(shape: HostShape, socket: int) -> float:
    if not shape.node_dir:
        return round(host_memtotal_kib(shape) / GIB_KIB, 2)
    return round(sum(node_total_kib(shape, n) for n in socket_nodes(shape, socket)) / GIB_KIB, 2)


def socket_available_gib(shape: HostShape, socket: int) -> float:
    kib = sum(node_available_kib(shape, n) for n in socket_nodes(shape, socket))
    return round(kib / GIB_KIB, 2)


def host_memtotal_kib(shape: HostShape) -> int:
    if shape.host_memtotal_gib is not None:
        return int(shape.host_memtotal_gib * GIB_KIB)
    nodes = shape.sockets * shape.nps + len(shape.memory_only_nodes)
    return sum(node_total_kib(shape, n) for n in range(nodes))
