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


def test_generation_of_known_test_machines(facts: HostFacts) -> None:
    """The machines this project runs on: a Genoa VM (25/0x11) or a Turin VM (26/0x02)."""
    known = {(25, 0x11): ("Genoa", "Zen 4"), (26, 0x02): ("Turin", "Zen 5")}
    key = (facts.cpu_family, facts.cpu_model_number)
    if key in known and facts.is_amd_epyc:
        assert (facts.epyc_generation, facts.zen_arch) == known[key]
        assert facts.is_supported_epyc


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
    firsts = set()
    for cpu in range(os.cpu_count() or 0):
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        if siblings.exists():
            text = siblings.read_text().strip()
            firsts.add(int(re.split(r"[-,]", text)[0]))
    listed = {int(c) for s in facts.socket_topology for c in _expand(s.physical_cpus)}
    assert listed == firsts


def _expand(cpulist: str) -> list[int]:
    out: list[int] = []
    for part in cpulist.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def test_real_busy_sample(facts: HostFacts) -> None:
    sampled = detect_host(ROOT, probe_runtimes=False, load_sample_seconds=0.2)
    assert set(sampled.socket_busy_pct) == {s.socket for s in facts.socket_topology}
    assert all(0.0 <= pct <= 100.0 for pct in sampled.socket_busy_pct.values())


def test_epycctl_detect_on_this_machine(facts: HostFacts) -> None:
    done = subprocess.run([EPYCCTL, "detect", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["physical_cores"] == facts.physical_cores
    assert data["epyc_generation"] == facts.epyc_generation
    table = subprocess.run([EPYCCTL, "detect"], capture_output=True, text=True)
    assert table.returncode == 0 and facts.epyc_generation in table.stdout
