"""CPU identity from `/proc/cpuinfo`: vendor, model name, CPUID family/model/stepping, flags.

All processors of a host are one part, so the identity comes from the first processor
block; per-processor `physical id` / `core id` are kept as the topology of last resort.
"""

from __future__ import annotations

from pydantic import BaseModel


class CpuIdentity(BaseModel):
    vendor: str
    model_name: str
    family: int | None
    model: int | None
    stepping: int | None
    flags: list[str]


class CpuinfoCore(BaseModel):
    """Where `/proc/cpuinfo` places one logical CPU (x86 prints `physical id`, `core id`)."""

    processor: int
    package: int | None
    core: int | None


def _blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if current:
                blocks.append(current)
                current = {}
            continue
        current.setdefault(key.strip(), value.strip())
    if current:
        blocks.append(current)
    return [block for block in blocks if "processor" in block]


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _first_block(text: str) -> dict[str, str]:
    """The first processor's block, without splitting the rest of a 1000-CPU file."""
    for chunk in text.split("\n\n"):
        blocks = _blocks(chunk)
        if blocks:
            return blocks[0]
    raise ValueError("no 'processor' entry")


def parse_identity(text: str) -> CpuIdentity:
    """Raises ValueError when no processor block is present."""
    first = _first_block(text)
    flags_text = first.get("flags", first.get("Features", ""))
    return CpuIdentity(
        vendor=first.get("vendor_id", first.get("CPU implementer", "unknown")),
        model_name=first.get("model name", ""),
        family=_int_or_none(first.get("cpu family")),
        model=_int_or_none(first.get("model")),
        stepping=_int_or_none(first.get("stepping")),
        flags=flags_text.split(),
    )


def parse_cores(text: str) -> dict[int, CpuinfoCore]:
    cores: dict[int, CpuinfoCore] = {}
    for block in _blocks(text):
        processor = _int_or_none(block.get("processor"))
        if processor is None:
            continue
        cores[processor] = CpuinfoCore(
            processor=processor,
            package=_int_or_none(block.get("physical id")),
            core=_int_or_none(block.get("core id")),
        )
    return cores
