"""Per-socket busy share from two `/proc/stat` samples; idle and iowait count as idle."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from epycd.errors import InputError
from epycd.host.files import parsed, read_required

STAT = "proc/stat"


class CpuTimes(NamedTuple):
    total: int
    idle: int


def parse_stat(text: str) -> dict[int, CpuTimes]:
    """Per-CPU jiffies. Total excludes guest time, which the kernel already counts in user."""
    times: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        values = [int(value) for value in fields[:8]]
        if len(values) < 4:
            raise ValueError(f"{name}: too few fields")
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        times[int(name[3:])] = CpuTimes(total=sum(values), idle=idle)
    if not times:
        raise ValueError("no per-CPU lines")
    return times


def read_stat(root: Path) -> dict[int, CpuTimes]:
    return parsed(root, STAT, read_required(root, STAT), parse_stat)


def busy_pct_between(
    before: Mapping[int, CpuTimes],
    after: Mapping[int, CpuTimes],
    socket_cpus: Mapping[int, Iterable[int]],
) -> dict[int, float]:
    """Busy % of each socket's CPUs between two samples (0.0 when no time passed)."""
    busy: dict[int, float] = {}
    for socket, cpus in socket_cpus.items():
        total = idle = 0
        for cpu in cpus:
            if cpu in before and cpu in after:
                total += after[cpu].total - before[cpu].total
                idle += after[cpu].idle - before[cpu].idle
        busy[socket] = round(100.0 * (total - idle) / total, 1) if total > 0 else 0.0
    return busy


def sample_socket_busy(
    root: Path, socket_cpus: Mapping[int, Iterable[int]], seconds: float
) -> dict[int, float]:
    """Two samples of `root/proc/stat`, `seconds` apart, reduced per socket."""
    if seconds < 0:
        raise InputError("the load sample interval cannot be negative", key="seconds")
    cpus = {socket: list(members) for socket, members in socket_cpus.items()}
    before = read_stat(root)
    time.sleep(seconds)
    return busy_pct_between(before, read_stat(root), cpus)
