"""`meminfo` files: `/proc/meminfo` and the per-node `nodeN/meminfo` (`Node N Key: V kB`)."""

from __future__ import annotations

from typing import NamedTuple

AVAILABLE_KEYS = ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")


class Memory(NamedTuple):
    total_bytes: int
    available_bytes: int


def parse_meminfo(text: str) -> dict[str, int]:
    """Key -> bytes (values in kB are scaled; unit-less counts are kept as they are).

    Raises ValueError when MemTotal is absent or a value is not a number.
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        words = key.split()
        if len(words) >= 3 and words[0] == "Node":
            words = words[2:]
        name = " ".join(words)
        fields = rest.split()
        if not fields:
            continue
        try:
            number = int(fields[0])
        except ValueError:
            raise ValueError(f"{name}: {fields[0]!r} is not a number") from None
        unit = fields[1].lower() if len(fields) > 1 else ""
        values[name] = number * 1024 if unit == "kb" else number
    if "MemTotal" not in values:
        raise ValueError("no MemTotal line")
    return values


def memory_of(values: dict[str, int]) -> Memory:
    """Total and available as vLLM's CPU worker counts them (docs/tuning.md rule 3, "What
    vLLM checks")."""
    return Memory(values["MemTotal"], sum(values.get(key, 0) for key in AVAILABLE_KEYS))
