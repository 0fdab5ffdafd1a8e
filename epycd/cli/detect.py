"""`epycctl detect`: the host facts, as JSON for scripts or tables for people."""

from __future__ import annotations

from pathlib import Path

import click

from epycd.cli.options import SAMPLE_SECONDS, TEXT, NonEmptyPath
from epycd.cli.output import json_option, print_json, table
from epycd.host.facts import HostFacts
from epycd.sizes import gib
from epycd.text import escaped_lines

REAL_ROOT = Path("/")


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def render_table(facts: HostFacts) -> str:
    """`epycctl detect`: the CPU, its sockets and NUMA nodes, the runtimes, the warnings."""
    parts = [
        _summary_table(facts),
        "",
        _sockets_table(facts),
        "",
        _nodes_table(facts),
        "",
        _runtimes_table(facts),
    ]
    if facts.gpus:
        parts += ["", _gpus_table(facts)]
    if facts.warnings:
        parts += ["", *(f"warning: {warning}" for warning in facts.warnings)]
    return "\n".join(parts)


def _summary_table(facts: HostFacts) -> str:
    cpuid = f"family {facts.cpu_family} model {facts.cpu_model_number}"
    if facts.cpu_stepping is not None:
        cpuid += f" stepping {facts.cpu_stepping}"
    return table(
        [
            ("CPU", facts.cpu_model or "(no model name)"),
            ("vendor", facts.vendor),
            ("CPUID", cpuid),
            ("AMD EPYC", _yes_no(facts.is_amd_epyc)),
            ("generation", facts.epyc_generation),
            ("Zen", facts.zen_arch or "unknown"),
            ("supported", _yes_no(facts.is_supported_epyc)),
            ("AVX-512", _yes_no(facts.avx512)),
            ("AVX-512 BF16", _yes_no(facts.avx512_bf16)),
            (
                "CPUs",
                f"{facts.logical_cores} logical, {facts.physical_cores} physical, "
                f"{facts.threads_per_core} thread(s) per core",
            ),
            ("offline CPUs", facts.offline_cpus or "none"),
            ("memory (MemTotal)", f"{facts.memory_gb} GiB"),
        ]
    )


def _sockets_table(facts: HostFacts) -> str:
    return table(
        [
            (
                sock.socket,
                sock.physical_cpus,
                sock.logical_cpus,
                ",".join(map(str, sock.numa_nodes)) or "-",
                sock.nps,
                sock.memory_gb,
                sock.memory_available_gb,
                facts.socket_busy_pct.get(sock.socket, "-"),
            )
            for sock in facts.socket_topology
        ],
        header=("socket", "physical CPUs", "logical CPUs", "nodes", "NPS", "GiB", "avail", "busy%"),
    )


def _nodes_table(facts: HostFacts) -> str:
    return table(
        [
            (
                node.node,
                len(node.cpus),
                gib(node.memory_total_bytes),
                gib(node.memory_available_bytes),
                " ".join(map(str, node.distances)) or "-",
            )
            for node in facts.nodes
        ],
        header=("node", "CPUs", "GiB", "avail", "distances"),
    )


def _runtimes_table(facts: HostFacts) -> str:
    runtimes = facts.runtimes
    rows = [("podman", _runtime(runtimes.podman.present, runtimes.podman.version))]
    if runtimes.podman.present:
        rows.append(
            (
                "",
                f"rootful {_yes_no(runtimes.podman.rootful)}, Quadlet "
                f"{_yes_no(runtimes.podman.quadlet)}, Notify=healthy "
                f"{_yes_no(runtimes.podman.notify_healthy)}",
            )
        )
    rows.append(("docker", _runtime(runtimes.docker.present, runtimes.docker.version)))
    if runtimes.docker.present:
        rows.append(("", f"daemon reachable {_yes_no(runtimes.docker.daemon_reachable)}"))
    if runtimes.vllm is not None:
        vllm = runtimes.vllm
        rows.append(("vllm", f"{vllm.path}: {vllm.version or vllm.error or 'not found'}"))
    return table(rows)


def _gpus_table(facts: HostFacts) -> str:
    rows = [
        (
            gpu.index,
            gpu.gfx_version,
            gpu.product,
            gpu.vram_gb,
            "-" if gpu.numa_node is None else gpu.numa_node,
            gpu.pci,
        )
        for gpu in facts.gpus
    ]
    header = ("GPU", "gfx", "product", "VRAM GiB", "node", "PCI")
    return table(rows, header=header) + f"\nROCm {facts.rocm_version or 'not found'}"


def _runtime(present: bool, version: str | None) -> str:
    return (version or "present, version unknown") if present else "absent"


def _configured_root() -> Path:
    from epycd.settings import load_settings

    return load_settings().host_root


@click.command(name="detect")
@json_option("Print the facts as JSON.")
@click.option(
    "--root",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=None,
    help="Host root holding proc/ and sys/ (default: EPYCD_HOST_ROOT or /).",
)
@click.option("--vllm", "vllm", type=TEXT, default=None, help="A host `vllm` executable to probe.")
@click.option(
    "--load-sample",
    type=SAMPLE_SECONDS,
    default=None,
    metavar="SECONDS",
    help="Measure per-socket busy % over this many seconds.",
)
def detect(as_json: bool, root: Path | None, vllm: str | None, load_sample: float | None) -> None:
    """Show the host: CPU, EPYC generation, sockets, NUMA nodes, memory, runtimes, GPUs.

    Container runtimes are probed only for the real root (/): a --root folder describes
    another host, whose podman and docker cannot be asked from here. --vllm is probed
    whenever given.
    """
    from epycd.host.detect import detect_host

    if root is None:
        root = _configured_root()
    facts = detect_host(
        root,
        vllm=vllm,
        load_sample_seconds=load_sample,
        probe_runtimes=root.resolve() == REAL_ROOT,
    )
    if as_json:
        print_json(facts.model_dump(mode="json"))
    else:
        click.echo(escaped_lines(render_table(facts)))
