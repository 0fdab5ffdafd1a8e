"""AMD GPUs of the host under a root folder: the KFD topology, the DRM cards, amd-smi.

Files read (all optional: a host without them has no GPU), in the kernel's formats:

- `sys/class/kfd/kfd/topology/nodes/N/properties`: one `name value` pair per line (decimal),
  as amdkfd's `node_show` writes them (linux drivers/gpu/drm/amd/amdkfd/kfd_topology.c,
  `sysfs_show_32bit_prop`/`sysfs_show_64bit_prop`). A node with `simd_count` > 0 and a
  `gfx_target_version` is a GPU (CPU nodes have no SIMDs). `gfx_target_version` is
  major*10000 + minor*100 + stepping (90402 = gfx942, 90010 = gfx90a, 90500 = gfx950;
  minor and stepping are written in hex in the name). `location_id` is the PCI
  (bus << 8) | devfn and `domain` the PCI domain; `drm_render_minor` the renderD minor.
  HIP numbers the GPUs in KFD node order, so the n-th GPU node is GPU n.
- `.../nodes/N/mem_banks/M/properties`: `heap_type` (1 FB_PUBLIC, 2 FB_PRIVATE: the local
  VRAM heap) and `size_in_bytes`; the VRAM when DRM does not say.
- `sys/class/drm/cardK/device/`: amdgpu's `mem_info_vram_total` (bytes), the PCI device's
  `numa_node` (-1: unknown) and its `uevent` (`PCI_SLOT_NAME=0000:05:00.0`).
- `opt/rocm/.info/version`: the ROCm release installed.
- `amd-smi static --asic --vram --json`, only for the real root and where amd-smi exists:
  a list (or `{"gpu_data": [...]}` in newer releases) of
  `{"gpu": N, "asic": {"market_name", "target_graphics_version"}, "bus": {"bdf"},
  "vram": {"size": {"value", "unit"}}}`; it names the product.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epycd.childproc import run_bounded
from epycd.host.facts import GpuFacts
from epycd.host.files import read_optional
from epycd.model.instinct import product_name
from epycd.sizes import GIB, gib

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
DRM_CLASS = "sys/class/drm"
ROCM_VERSION = "opt/rocm/.info/version"
VRAM_HEAPS = frozenset({1, 2})
AMD_SMI_ARGV = ["amd-smi", "static", "--asic", "--vram", "--json"]
AMD_SMI_TIMEOUT_S = 20
AMD_SMI_MAX_BYTES = 4 * 1024 * 1024
"""amd-smi's JSON is a few KiB per GPU."""


def parse_properties(text: str) -> dict[str, int]:
    """`name value` lines of a KFD properties file; lines that are not that are skipped."""
    props: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdecimal():
            props[parts[0]] = int(parts[1])
    return props


def gfx_name(target_version: int) -> str:
    """90402 -> gfx942, 90010 -> gfx90a: major in decimal, minor and stepping in hex."""
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def pci_address(domain: int, location_id: int) -> str:
    bus, devfn = divmod(location_id, 256)
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


@dataclass(frozen=True)
class DrmCard:
    vram_bytes: int | None
    numa_node: int | None


def _node_number(path: Path) -> int:
    return int(path.name) if path.name.isdecimal() else -1


def read_drm_cards(root: Path) -> dict[str, DrmCard]:
    """PCI address -> what its DRM card says (VRAM, NUMA node)."""
    cards: dict[str, DrmCard] = {}
    folder = root / DRM_CLASS
    for card in sorted(folder.glob("card*/device")) if folder.is_dir() else []:
        uevent = read_optional(root, str(card.relative_to(root) / "uevent")) or ""
        slot = next(
            (line.split("=", 1)[1].strip() for line in uevent.splitlines()
             if line.startswith("PCI_SLOT_NAME=")),
            None,
        )  # fmt: skip
        if slot is None:
            continue
        vram = read_optional(root, str(card.relative_to(root) / "mem_info_vram_total"))
        numa = read_optional(root, str(card.relative_to(root) / "numa_node"))
        numa_node = int(numa) if numa and numa.strip().lstrip("-").isdecimal() else None
        cards[slot.lower()] = DrmCard(
            vram_bytes=int(vram) if vram and vram.strip().isdecimal() else None,
            numa_node=numa_node if numa_node is not None and numa_node >= 0 else None,
        )
    return cards


def _bank_vram(root: Path, node: Path) -> int | None:
    total = 0
    for bank in sorted((node / "mem_banks").glob("*/properties")):
        props = parse_properties(read_optional(root, str(bank.relative_to(root))) or "")
        if props.get("heap_type") in VRAM_HEAPS:
            total += props.get("size_in_bytes", 0)
    return total or None


def read_gpus(root: Path, amd_smi: list[dict[str, Any]] | None = None) -> list[GpuFacts]:
    """The GPUs of the host at `root`, in HIP's order; [] when it has no KFD topology."""
    folder = root / KFD_NODES
    if not folder.is_dir():
        return []
    cards = read_drm_cards(root)
    by_bdf = {str(entry.get("bus", {}).get("bdf", "")).lower(): entry for entry in amd_smi or []}
    gpus: list[GpuFacts] = []
    for node in sorted(folder.iterdir(), key=_node_number):
        props = parse_properties(read_optional(root, f"{KFD_NODES}/{node.name}/properties") or "")
        target = props.get("gfx_target_version", 0)
        if props.get("simd_count", 0) <= 0 or target <= 0:
            continue
        pci = pci_address(props.get("domain", 0), props.get("location_id", 0))
        card = cards.get(pci, DrmCard(None, None))
        vram = card.vram_bytes or _bank_vram(root, node) or _smi_vram(by_bdf.get(pci)) or 0
        gfx = gfx_name(target)
        gpus.append(
            GpuFacts(
                index=len(gpus),
                gfx_version=gfx,
                product=_smi_product(by_bdf.get(pci)) or product_name(gfx, vram / GIB),
                vram_gb=gib(vram),
                numa_node=card.numa_node,
                pci=pci,
                render_minor=props.get("drm_render_minor"),
            )
        )
    return gpus


def _smi_product(entry: dict[str, Any] | None) -> str | None:
    name = (entry or {}).get("asic", {}).get("market_name")
    return name if isinstance(name, str) and name and name != "N/A" else None


SMI_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def _smi_vram(entry: dict[str, Any] | None) -> int | None:
    size = (entry or {}).get("vram", {}).get("size", {})
    if not isinstance(size, dict) or not isinstance(size.get("value"), int):
        return None
    factor = SMI_UNITS.get(str(size.get("unit", "MB")).upper())
    return size["value"] * factor if factor else None


def parse_amd_smi(text: str) -> list[dict[str, Any]]:
    """amd-smi's JSON (a list, or `{"gpu_data": [...]}`); [] when it is neither."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    return [entry for entry in data if isinstance(entry, dict)] if isinstance(data, list) else []


def run_amd_smi() -> list[dict[str, Any]]:
    """amd-smi's answer on this machine; [] where it is missing, fails or times out."""
    if shutil.which(AMD_SMI_ARGV[0]) is None:
        return []
    try:
        done = run_bounded(AMD_SMI_ARGV, timeout=AMD_SMI_TIMEOUT_S, max_bytes=AMD_SMI_MAX_BYTES)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_amd_smi(done.stdout) if done.returncode == 0 else []


def read_rocm_version(root: Path) -> str | None:
    text = read_optional(root, ROCM_VERSION)
    return text.strip().splitlines()[0] if text and text.strip() else None
