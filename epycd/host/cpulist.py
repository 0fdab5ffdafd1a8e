"""The kernel's CPU list format (`0-3,8,10-11`), as in `cpu/online` and `nodeN/cpulist`."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> list[int]:
    """Sorted, de-duplicated CPU numbers of a CPU list; empty text is no CPUs.

    Raises ValueError on anything that is not a CPU list (the caller names the file).
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        if sep:
            low, high = int(first), int(last)
            if low < 0 or high < low:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(low, high + 1))
        else:
            cpu = int(first)
            if cpu < 0:
                raise ValueError(f"bad CPU number {part!r}")
            cpus.add(cpu)
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """The shortest CPU list for these CPUs: consecutive runs collapse to `a-b`."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        runs.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(runs)
