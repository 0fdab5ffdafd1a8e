"""`epycctl detect`: JSON contract, table, bad input exit 2 without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from epycd.cli import main
from tests.hosts import make_host

EPYCCTL = str(Path(sys.executable).parent / "epycctl")

DESIGN_KEYS = {
    "cpu_model", "vendor", "cpu_family", "cpu_model_number", "is_amd_epyc",
    "epyc_generation", "zen_arch", "is_supported_epyc", "avx512", "avx512_bf16",
    "logical_cores", "physical_cores", "sockets", "threads_per_core", "numa_nodes",
    "memory_gb", "socket_topology",
}  # fmt: skip
SOCKET_KEYS = {"socket", "physical_cpus", "logical_cpus", "numa_nodes", "memory_gb"}


def test_json_has_design_keys(tmp_path: Path) -> None:
    root = make_host(tmp_path, "genoa-9654-2s-nps4")
    result = CliRunner().invoke(main, ["detect", "--json", "--root", str(root)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) >= DESIGN_KEYS
    assert data["epyc_generation"] == "Genoa"
    assert data["sockets"] == 2
    for sock in data["socket_topology"]:
        assert set(sock) >= SOCKET_KEYS
        assert isinstance(sock["physical_cpus"], str)
        assert all(isinstance(n, int) for n in sock["numa_nodes"])
    assert data["socket_topology"][1]["physical_cpus"] == "96-191"
    assert data["socket_topology"][1]["numa_nodes"] == [4, 5, 6, 7]
    # a fake root describes another host: this machine's runtimes are not asked
    assert data["runtimes"]["podman"]["present"] is False


def test_root_from_environment(tmp_path: Path) -> None:
    root = make_host(tmp_path, "milan-7763-2s")
    result = CliRunner().invoke(main, ["detect", "--json"], env={"EPYCD_HOST_ROOT": str(root)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["epyc_generation"] == "Milan"


def test_table_for_people(tmp_path: Path) -> None:
    root = make_host(tmp_path, "turin-9965")
    result = CliRunner().invoke(main, ["detect", "--root", str(root)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "AMD EPYC 9965 192-Core Processor" in out
    assert "Turin" in out and "Zen 5c" in out
    lines = out.splitlines()
    socket_rows = [line.split() for line in lines if line.startswith(("0  ", "1  "))]
    assert socket_rows[1][:6] == ["1", "192-383", "192-383,576-767", "1", "1", "768.0"]


@pytest.mark.parametrize(
    "relative", ["proc/cpuinfo", "proc/meminfo", "sys/devices/system/cpu/online"]
)
def test_missing_file_exit_2_names_it(tmp_path: Path, relative: str) -> None:
    root = make_host(tmp_path, "vm-zen5")
    (root / relative).unlink()
    done = subprocess.run(
        [EPYCCTL, "detect", "--json", "--root", str(root)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert str(root / relative) in done.stderr
    assert "Traceback" not in done.stderr
    error = json.loads(done.stdout)  # the --json contract: one object, error or not
    assert error["result"] == "error" and error["exit_code"] == 2
    assert error["error"] == done.stderr.strip().removeprefix("epycctl: ")


def test_load_sample_option(tmp_path: Path) -> None:
    root = make_host(tmp_path, "vm-zen5")
    result = CliRunner().invoke(
        main, ["detect", "--json", "--root", str(root), "--load-sample", "0"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["socket_busy_pct"] == {"0": 0.0}


def test_bad_daemon_conf_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "epycd.conf").write_text("host_root = 5\n")
    env = {**os.environ, "EPYCD_CONFIG_DIR": str(tmp_path)}
    env.pop("EPYCD_HOST_ROOT", None)
    done = subprocess.run([EPYCCTL, "detect", "--json"], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert str(tmp_path / "epycd.conf") in done.stderr and "host_root" in done.stderr
    assert "Traceback" not in done.stderr


def test_detect_stays_lazy(tmp_path: Path) -> None:
    """What `epycctl detect --root` loads: none of the network or planning stack."""
    root = make_host(tmp_path, "vm-zen5")
    probe = (
        "import sys\n"
        "from epycd.cli import main\n"
        f"main(['detect', '--json', '--root', {str(root)!r}], standalone_mode=False)\n"
        "heavy = ['httpx', 'huggingface_hub', 'pydantic_settings', 'epycd.plan', 'asyncio']\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "LOADED []"
