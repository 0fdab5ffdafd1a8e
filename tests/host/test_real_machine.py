"""Detection of the machine the tests run on, against independent readings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from tests.machine import expand, physical_cpus, real_cpu

ROOT = Path("/")
EPYCCTL = str(Path(sys.executable).parent / "epycctl")


@pytest.fixture(scope="module")
def facts() -> HostFacts:
    return detect_host(ROOT, probe_runtimes=False)


def cpuinfo_field(name: str) -> list[str]:
    text = Path("/proc/cpuinfo").read_text()
    return re.findall(rf"^{re.escape(name)}\s*:\s*(.*)$", text, re.M)


def test_counts_agree_with_os_and_psutil(facts: HostFacts) -> None:
    assert facts.logical_cores == os.cpu_count() == psutil.cpu_count(logical=True)
    assert facts.physical_cores == psutil.cpu_count(logical=False)
    assert facts.sockets == len(set(cpuinfo_field("physical id")))


def test_identity_agrees_with_proc_cpuinfo(facts: HostFacts) -> None:
    assert facts.vendor == cpuinfo_field("vendor_id")[0]
    assert facts.cpu_model == cpuinfo_field("model name")[0]
    assert facts.cpu_family == int(cpuinfo_field("cpu family")[0])
    assert facts.cpu_model_number == int(cpuinfo_field("model")[0])
    flags = cpuinfo_field("flags")[0].split()
    assert facts.avx512 == ("avx512f" in flags)
    assert facts.avx512_bf16 == ("avx512_bf16" in flags)


def test_generation_agrees_with_the_independent_reading(facts: HostFacts) -> None:
    """Whatever CPU runs the tests (a Zen4 or Zen5 VM, a named EPYC, an Intel Xeon): the
    generation and support come out as tests/machine.py reads them from /proc/cpuinfo."""
    cpu = real_cpu()
    assert facts.is_amd_epyc == cpu.is_amd_epyc
    assert facts.epyc_generation == cpu.generation
    assert facts.is_supported_epyc == cpu.is_supported_epyc
    if not cpu.is_amd_epyc:
        assert facts.zen_arch is None


def test_memory_agrees_with_psutil_and_numactl(facts: HostFacts) -> None:
    assert abs(facts.memory_gb - psutil.virtual_memory().total / 1024**3) < 0.02
    numactl = shutil.which("numactl")
    assert numactl, "numactl missing: run tests/bootstrap.sh (apt-get install numactl)"
    out = subprocess.run([numactl, "--hardware"], capture_output=True, text=True).stdout
    sizes = {int(n): int(mb) for n, mb in re.findall(r"^node (\d+) size: (\d+) MB", out, re.M)}
    cpus = {
        int(n): [int(c) for c in cs.split()]
        for n, cs in re.findall(r"^node (\d+) cpus:(.*)$", out, re.M)
    }
    assert [node.node for node in facts.nodes] == sorted(sizes)
    for node in facts.nodes:
        # node memory grows on this VM (lazy init): allow 2 % between the two readings
        mb = node.memory_total_bytes / 1024**2
        assert abs(mb - sizes[node.node]) <= max(2, 0.02 * sizes[node.node])
        assert node.cpus == cpus[node.node]
        assert 0 < node.memory_available_bytes <= node.memory_total_bytes


def test_physical_cpus_are_first_threads(facts: HostFacts) -> None:
    listed = {cpu for s in facts.socket_topology for cpu in expand(s.physical_cpus)}
    assert listed == set(physical_cpus())
    assert facts.physical_cores == len(physical_cpus())


def test_real_busy_sample(facts: HostFacts) -> None:
    sampled = detect_host(ROOT, probe_runtimes=False, load_sample_seconds=0.2)
    assert set(sampled.socket_busy_pct) == {s.socket for s in facts.socket_topology}
    assert all(0.0 <= pct <= 100.0 for pct in sampled.socket_busy_pct.values())


def test_epycctl_detect_on_this_machine() -> None:
    """The command, against readings made without epycd."""
    done = subprocess.run([EPYCCTL, "detect", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    cpu = real_cpu()
    assert (data["vendor"], data["cpu_model"]) == (cpu.vendor, cpu.name)
    assert (data["cpu_family"], data["cpu_model_number"]) == (cpu.family, cpu.model)
    assert data["physical_cores"] == len(physical_cpus())
    assert data["epyc_generation"] == cpu.generation
    table = subprocess.run([EPYCCTL, "detect"], capture_output=True, text=True)
    assert table.returncode == 0 and cpu.name in table.stdout
    assert cpu.generation in table.stdout
