"""`epycctl detect` on Instinct hosts: the GPUs from the KFD topology and DRM cards of a fake
host root, with their NUMA nodes (docs/instinct.md, "What the host says")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from epycd.host.gpus import gfx_name, parse_amd_smi, pci_address, read_gpus
from tests.hosts import make_host
from tests.sandbox import run_python

GPU_KEYS = {"index", "gfx_version", "vram_gb", "numa_node", "pci"}


def detect_json(root: Path) -> dict[str, object]:
    done = run_python(["-m", "epycd", "detect", "--json", "--root", str(root)], env=os.environ)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


def test_eight_mi300x_four_per_socket(tmp_path: Path) -> None:
    data = detect_json(make_host(tmp_path, "genoa-2s-8x-mi300x"))
    gpus = data["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 8
    assert all(set(gpu) >= GPU_KEYS for gpu in gpus)
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert {gpu["gfx_version"] for gpu in gpus} == {"gfx942"}
    assert {gpu["vram_gb"] for gpu in gpus} == {192.0}
    assert [gpu["numa_node"] for gpu in gpus] == [0, 1, 2, 3, 4, 5, 6, 7]
    sockets = data["socket_topology"]
    assert isinstance(sockets, list)
    by_socket = {s["socket"]: set(s["numa_nodes"]) for s in sockets}
    assert sum(gpu["numa_node"] in by_socket[0] for gpu in gpus) == 4
    assert gpus[0]["product"] == "AMD Instinct MI300X"
    assert gpus[1]["pci"] == "0000:15:00.0"
    assert data["rocm_version"] == "7.0.2-56"


def test_mi355x_and_mi210(tmp_path: Path) -> None:
    mi355 = detect_json(make_host(tmp_path, "turin-2s-8x-mi355x"))["gpus"]
    assert isinstance(mi355, list)
    assert {g["gfx_version"] for g in mi355} == {"gfx950"}
    assert [g["numa_node"] for g in mi355] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert mi355[0]["vram_gb"] == 288.0
    mi210 = detect_json(make_host(tmp_path, "genoa-1x-mi210"))["gpus"]
    assert isinstance(mi210, list)
    assert [(g["gfx_version"], g["vram_gb"], g["product"]) for g in mi210] == [
        ("gfx90a", 64.0, "AMD Instinct MI210")
    ]


def test_no_gpu(tmp_path: Path) -> None:
    data = detect_json(make_host(tmp_path, "genoa-9654-2s-nps4"))
    assert data["gpus"] == []
    assert data["rocm_version"] is None


def test_table_lists_gpus_with_their_nodes(tmp_path: Path) -> None:
    root = make_host(tmp_path, "genoa-2s-8x-mi300x")
    done = run_python(["-m", "epycd", "detect", "--root", str(root)], env=os.environ)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if " gfx942 " in line]
    assert len(rows) == 8
    assert rows[5][0] == "5" and "5" in rows[5][-2:]
    assert "ROCm 7.0.2-56" in done.stdout


def test_vram_from_mem_banks_without_drm(tmp_path: Path) -> None:
    """No DRM card (an older amdgpu without mem_info_vram_total): the KFD VRAM heap says."""
    root = make_host(tmp_path, "genoa-1x-mi210")
    for path in sorted((root / "sys/class/drm").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (gpu,) = read_gpus(root)
    assert gpu.vram_gb == 64.0 and gpu.numa_node is None


@pytest.mark.parametrize(
    ("version", "name"),
    [(90402, "gfx942"), (90500, "gfx950"), (90010, "gfx90a"), (110001, "gfx1101")],
)
def test_gfx_names(version: int, name: str) -> None:
    assert gfx_name(version) == name


def test_pci_address_from_location_id() -> None:
    assert pci_address(0, (0x83 << 8) | (0x1 << 3) | 2) == "0000:83:01.2"


def test_amd_smi_names_the_product(tmp_path: Path) -> None:
    listing = [
        {
            "gpu": 0,
            "asic": {"market_name": "AMD Instinct MI325X", "target_graphics_version": "gfx942"},
            "bus": {"bdf": "0000:05:00.0"},
            "vram": {"type": "HBM3E", "size": {"value": 262144, "unit": "MB"}},
        }
    ]
    for text in (json.dumps(listing), json.dumps({"gpu_data": listing})):
        entries = parse_amd_smi(text)
        (gpu, *_rest) = read_gpus(make_host(tmp_path, "genoa-2s-8x-mi300x"), entries)
        assert gpu.product == "AMD Instinct MI325X"
    assert parse_amd_smi("not json") == []
