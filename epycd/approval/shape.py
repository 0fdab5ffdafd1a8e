"""The host facts that shape a plan and cannot change on their own between boots.

Volatile figures (available memory, busy %, the runtimes' answers) are left out, so that a
boot-time comparison refuses a changed machine and never a busy one. Node MemTotal is kept
but compared only against what the plan needs: it grows on hosts with lazy memory init.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from epycd.host.facts import HostFacts


class SocketShape(BaseModel):
    socket: int
    physical_cores: int
    physical_cpus: str
    numa_nodes: list[int]
    memory_gb: float


class HostShape(BaseModel):
    vendor: str
    cpu_model: str
    cpu_family: int | None
    cpu_model_number: int | None
    epyc_generation: str
    zen_arch: str | None
    avx512_bf16: bool
    sockets: list[SocketShape]
    gpus: dict[int, str] = Field(
        default_factory=dict, description="GPU index -> gfx, VRAM GiB, NUMA node, PCI"
    )

    def socket(self, index: int) -> SocketShape | None:
        return next((s for s in self.sockets if s.socket == index), None)


def host_shape(host: HostFacts) -> HostShape:
    return HostShape(
        vendor=host.vendor,
        cpu_model=host.cpu_model,
        cpu_family=host.cpu_family,
        cpu_model_number=host.cpu_model_number,
        epyc_generation=host.epyc_generation,
        zen_arch=host.zen_arch,
        avx512_bf16=host.avx512_bf16,
        gpus={
            gpu.index: f"{gpu.gfx_version} {int(gpu.vram_gb)} GiB node {gpu.numa_node} {gpu.pci}"
            for gpu in host.gpus
        },
        sockets=[
            SocketShape(
                socket=sock.socket,
                physical_cores=sock.physical_cores,
                physical_cpus=sock.physical_cpus,
                numa_nodes=sock.numa_nodes,
                memory_gb=sock.memory_gb,
            )
            for sock in host.socket_topology
        ],
    )


IDENTITY_FIELDS = (
    ("vendor", "CPU vendor"),
    ("cpu_model", "CPU"),
    ("cpu_family", "CPU family"),
    ("cpu_model_number", "CPU model"),
    ("epyc_generation", "EPYC generation"),
    ("zen_arch", "Zen architecture"),
    ("avx512_bf16", "avx512_bf16"),
)


def shape_changes(
    approved: HostShape,
    now: HostShape,
    *,
    socket: int,
    required_gb: float,
    gpus: Sequence[int] = (),
) -> list[str]:
    """What changed that matters to an endpoint pinned to `socket` needing `required_gb`
    (and, for an Instinct endpoint, to its `gpus`)."""
    changes = [
        f"{label} {getattr(approved, field)} -> {getattr(now, field)}"
        for field, label in IDENTITY_FIELDS
        if getattr(approved, field) != getattr(now, field)
    ]
    changes += [
        f"GPU {index} {approved.gpus.get(index, 'absent')} -> {now.gpus.get(index, 'gone')}"
        for index in gpus
        if approved.gpus.get(index) != now.gpus.get(index)
    ]
    was, is_ = approved.socket(socket), now.socket(socket)
    if is_ is None:
        changes.append(f"socket {socket} is gone ({len(now.sockets)} socket(s) now)")
        return changes
    if was is None:
        changes.append(f"socket {socket} was not in the approved host")
        return changes
    if was.physical_cores != is_.physical_cores:
        changes.append(
            f"socket {socket} physical cores {was.physical_cores} -> {is_.physical_cores}"
        )
    elif was.physical_cpus != is_.physical_cpus:
        changes.append(f"socket {socket} CPUs {was.physical_cpus} -> {is_.physical_cpus}")
    if was.numa_nodes != is_.numa_nodes:
        changes.append(f"socket {socket} NUMA nodes {was.numa_nodes} -> {is_.numa_nodes}")
    if is_.memory_gb < required_gb:
        changes.append(
            f"socket {socket} memory {was.memory_gb:g} GiB -> {is_.memory_gb:g} GiB, "
            f"below the {required_gb:g} GiB the plan needs"
        )
    return changes
