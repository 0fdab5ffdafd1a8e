"""Per-socket busy % from two proc/stat samples."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from epycd.errors import InputError
from epycd.host.detect import detect_host, socket_cpus
from epycd.host.load import busy_pct_between, parse_stat, sample_socket_busy
from tests.hosts import make_host, write_proc_stat

BEFORE = """cpu  0 0 0 0 0 0 0 0 0 0
cpu0 100 0 100 800 0 0 0 0 0 0
cpu1 100 0 100 800 0 0 0 0 0 0
cpu2 100 0 100 800 0 0 0 0 0 0
cpu3 100 0 100 800 0 0 0 0 0 0
intr 1 2 3
"""
# 100 jiffies per CPU pass. cpu0: 90 busy. cpu1: 10 busy + 40 iowait (idle) + 50 idle.
# cpu2: all idle. cpu3: 30 busy (10 irq, 10 softirq, 10 steal) + 70 idle.
# guest (col 9) is already inside user and must not count twice.
AFTER = """cpu  0 0 0 0 0 0 0 0 0 0
cpu0 180 0 110 810 0 0 0 0 50 0
cpu1 105 0 105 850 40 0 0 0 0 0
cpu2 100 0 100 900 0 0 0 0 0 0
cpu3 100 0 100 870 0 10 10 10 0 0
"""


def test_busy_from_crafted_samples() -> None:
    before, after = parse_stat(BEFORE), parse_stat(AFTER)
    busy = busy_pct_between(before, after, {0: [0, 1], 1: [2, 3], 2: [0], 3: [1]})
    assert busy == {0: 50.0, 1: 15.0, 2: 90.0, 3: 10.0}


def test_no_time_passed_is_zero() -> None:
    same = parse_stat(BEFORE)
    assert busy_pct_between(same, same, {0: [0, 1]}) == {0: 0.0}


def test_parse_stat_rejects_no_cpu_lines() -> None:
    with pytest.raises(ValueError):
        parse_stat("cpu  1 2 3 4\nintr 0\n")


def test_sample_reads_two_samples_apart(tmp_path: Path) -> None:
    root = make_host(tmp_path, "genoa-9654-2s-nps1")
    facts = detect_host(root, probe_runtimes=False)
    cpus = socket_cpus(facts.socket_topology)
    write_proc_stat(root, {cpu: (0, 0, 0, 0) for cpu in range(384)})
    # socket 0 fully busy, socket 1 a quarter busy (and iowait counts as idle)
    later = {cpu: (100, 0, 0, 0) for cpu in cpus[0]}
    later |= {cpu: (20, 5, 50, 25) for cpu in cpus[1]}
    timer = threading.Timer(0.2, write_proc_stat, args=(root, later))
    timer.start()
    try:
        busy = sample_socket_busy(root, cpus, 0.6)
    finally:
        timer.join()
    assert busy == {0: 100.0, 1: 25.0}


def test_detect_samples_only_when_asked(tmp_path: Path) -> None:
    root = make_host(tmp_path, "vm-zen5")
    assert detect_host(root, probe_runtimes=False).socket_busy_pct == {}
    sampled = detect_host(root, probe_runtimes=False, load_sample_seconds=0.0)
    assert sampled.socket_busy_pct == {0: 0.0}


def test_missing_stat_when_sampling_names_it(tmp_path: Path) -> None:
    root = make_host(tmp_path, "vm-zen5")
    (root / "proc/stat").unlink()
    assert detect_host(root, probe_runtimes=False).socket_busy_pct == {}
    with pytest.raises(InputError, match="proc/stat"):
        detect_host(root, probe_runtimes=False, load_sample_seconds=0.1)
