"""Where each online logical CPU sits: package (socket), core, L3 group.

Read from `sys/devices/system/cpu/cpuN/topology/` and `cache/index3/shared_cpu_list`.
A core is the set of online CPUs of one package that are each other's
`thread_siblings_list` (the kernel builds that set from package, die and core ids, so it
stays right where core_id repeats across dies); without it, the CPUs sharing
(package, core_id); where sysfs has neither, `/proc/cpuinfo`'s `physical id` / `core id`;
failing all, the CPU is its own core on package 0. The core's physical CPU is its
lowest-numbered online thread.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from epycd.host.cpuinfo import CpuinfoCore
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.files import read_optional

CPU_DIR = "sys/devices/system/cpu"


CoreKey = tuple[int, str, int]
"""(package, what identifies the core: "siblings" | "core_id" | "cpu", that number)."""


class CpuPlace(NamedTuple):
    cpu: int
    package: int
    core: CoreKey
    l3: tuple[int, ...] | None


class Core(NamedTuple):
    package: int
    threads: tuple[int, ...]

    @property
    def first(self) -> int:
        return self.threads[0]


def _int_file(root: Path, relative: str) -> int | None:
    text = read_optional(root, relative)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _cpulist_file(root: Path, relative: str, online: frozenset[int]) -> tuple[int, ...] | None:
    text = read_optional(root, relative)
    if text is None:
        return None
    try:
        return tuple(cpu for cpu in parse_cpulist(text) if cpu in online)
    except ValueError:
        return None


def read_place(
    root: Path, cpu: int, online: frozenset[int], cpuinfo: Callable[[], Mapping[int, CpuinfoCore]]
) -> tuple[CpuPlace, bool]:
    """The CPU's place and whether sysfs topology described it fully."""
    base = f"{CPU_DIR}/cpu{cpu}/topology"
    package = _int_file(root, f"{base}/physical_package_id")
    siblings = _cpulist_file(root, f"{base}/thread_siblings_list", online)
    core_id = _int_file(root, f"{base}/core_id")
    has_core = bool(siblings and cpu in siblings) or core_id is not None
    complete = package is not None and package >= 0 and has_core
    fallback = None if complete else cpuinfo().get(cpu)
    if package is None or package < 0:
        package = fallback.package if fallback and fallback.package is not None else 0
    core: CoreKey
    if siblings and cpu in siblings:
        core = (package, "siblings", min(siblings))
    elif core_id is not None:
        core = (package, "core_id", core_id)
    elif fallback and fallback.core is not None:
        core = (package, "core_id", fallback.core)
    else:
        core = (package, "cpu", cpu)
    l3 = _cpulist_file(root, f"{CPU_DIR}/cpu{cpu}/cache/index3/shared_cpu_list", online)
    return CpuPlace(cpu, package, core, l3 or None), complete


def read_places(
    root: Path, online: Iterable[int], cpuinfo: Callable[[], Mapping[int, CpuinfoCore]]
) -> tuple[list[CpuPlace], list[int]]:
    """Places of the online CPUs, and the CPUs whose sysfs topology was incomplete.

    `cpuinfo` gives /proc/cpuinfo's placement, parsed only if some CPU needs it."""
    online_set = frozenset(online)
    places: list[CpuPlace] = []
    incomplete: list[int] = []
    for cpu in sorted(online_set):
        place, complete = read_place(root, cpu, online_set, cpuinfo)
        places.append(place)
        if not complete:
            incomplete.append(cpu)
    return places, incomplete


def cores_of(places: Iterable[CpuPlace]) -> list[Core]:
    """Cores ordered by their first thread."""
    threads: dict[CoreKey, list[int]] = defaultdict(list)
    for place in places:
        threads[place.core].append(place.cpu)
    cores = [Core(key[0], tuple(sorted(cpus))) for key, cpus in threads.items()]
    return sorted(cores, key=lambda core: core.first)


def l3_groups(places: Iterable[CpuPlace]) -> list[str]:
    """Distinct L3 sharing sets of these CPUs as CPU lists, ordered by first CPU."""
    groups = {place.l3 for place in places if place.l3}
    return [format_cpulist(group) for group in sorted(groups, key=min)]
