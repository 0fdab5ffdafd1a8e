"""EPYC generation and Zen architecture: the model-name rule reconciled with CPUID.

Name rule (docs/sources.md, "EPYC generations"): in `EPYC abcd` the first digit
is the series and the last the generation: 4xx4 EPYC 4004, 4xx5 EPYC 4005, 7xx1 Naples,
7xx2 Rome, 7xx3 Milan, 8xx4 Siena, 97x4 Bergamo, other 9xx4 Genoa, 9xx5 Turin (the dense
parts 9645, 9745, 9825, 9845, 9965 are Zen 5c), 9xx6 Venice. Cloud parts carry a letter
in the middle (9B14, 9R14, 7R13, 72F3) and follow the same rule.

CPUID family/model (the `cpu family` / `model` of /proc/cpuinfo), from the public table
at https://en.wikichip.org/wiki/amd/cpuid (revision of July 2025) and AMD's revision
guides named there:
  family 0x17: Naples ("Zeppelin") 0x00-0x0f, Rome ("Starship") 0x30-0x3f
  family 0x19: Milan 0x00-0x0f, Genoa ("Stones", EPYC 9004 = model 0x11) 0x10-0x1f,
               Raphael (AM5; the EPYC 4004 parts) 0x60-0x6f,
               Bergamo and Siena ("Stones Dense", Zen 4c) 0xa0-0xaf
  family 0x1a: Turin ("Breithorn") 0x00-0x0f, Turin Dense (Zen 5c, EPYC 9965) 0x10-0x1f,
               Granite Ridge (AM5; the EPYC 4005 parts) 0x40-0x4f,
               Zen 6 EPYC: "Weisshorn" 0x50-0x5f and Venice (EPYC 9006) 0x90-0x9f
The name wins where it carries a model number; family/model decides where it has none
(cloud VMs report just "AMD EPYC"). When both name the same generation, CPUID's Zen
architecture is kept because it tells dense dies apart for part numbers not listed here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from epycd.host.facts import SUPPORTED_GENERATIONS, EpycGeneration

AMD_VENDOR = "AuthenticAMD"

DENSE_TURIN_PARTS: frozenset[str] = frozenset({"9645", "9745", "9825", "9845", "9965"})

_MODEL_NUMBER = re.compile(r"\bEPYC\s+(?:Embedded\s+)?(\d[0-9A-Z]{2}\d)(?![0-9])")
_CODENAMES: tuple[tuple[str, EpycGeneration, str], ...] = (
    ("Naples", "Naples", "Zen 1"),
    ("Rome", "Rome", "Zen 2"),
    ("Milan", "Milan", "Zen 3"),
    ("Genoa", "Genoa", "Zen 4"),
    ("Bergamo", "Bergamo", "Zen 4c"),
    ("Siena", "Siena", "Zen 4c"),
    ("Turin", "Turin", "Zen 5"),
    ("Venice", "Venice", "Zen 6"),
)


class Generation(NamedTuple):
    generation: EpycGeneration
    zen_arch: str | None


UNKNOWN = Generation("unknown", None)


def is_amd_epyc(vendor: str, model_name: str) -> bool:
    return vendor == AMD_VENDOR and "EPYC" in model_name


def model_number(model_name: str) -> str | None:
    """The four-character part number of an EPYC name (`9654`, `4584`, `9B14`), if any."""
    match = _MODEL_NUMBER.search(model_name)
    return match.group(1) if match else None


def from_model_number(part: str) -> Generation:
    series, last = part[0], part[-1]
    if series == "4":
        return {"4": Generation("EPYC 4004", "Zen 4"), "5": Generation("EPYC 4005", "Zen 5")}.get(
            last, UNKNOWN
        )
    if series == "7":
        return {
            "1": Generation("Naples", "Zen 1"),
            "2": Generation("Rome", "Zen 2"),
            "3": Generation("Milan", "Zen 3"),
        }.get(last, UNKNOWN)
    if series == "8" and last == "4":
        return Generation("Siena", "Zen 4c")
    if series == "9":
        if last == "4":
            return (
                Generation("Bergamo", "Zen 4c") if part[1] == "7" else Generation("Genoa", "Zen 4")
            )
        if last == "5":
            return Generation("Turin", "Zen 5c" if part in DENSE_TURIN_PARTS else "Zen 5")
        if last == "6":
            return Generation("Venice", "Zen 6")
    return UNKNOWN


def from_cpuid(family: int | None, model: int | None) -> Generation:
    """Generation of an EPYC from CPUID family/model; Bergamo vs Siena stays unknown."""
    if family is None or model is None:
        return UNKNOWN
    if family == 0x17:
        if model <= 0x0F:
            return Generation("Naples", "Zen 1")
        if 0x30 <= model <= 0x3F:
            return Generation("Rome", "Zen 2")
    elif family == 0x19:
        if model <= 0x0F:
            return Generation("Milan", "Zen 3")
        if 0x10 <= model <= 0x1F:
            return Generation("Genoa", "Zen 4")
        if 0x60 <= model <= 0x6F:
            return Generation("EPYC 4004", "Zen 4")
        if 0xA0 <= model <= 0xAF:
            return Generation("unknown", "Zen 4c")
    elif family == 0x1A:
        if model <= 0x0F:
            return Generation("Turin", "Zen 5")
        if 0x10 <= model <= 0x1F:
            return Generation("Turin", "Zen 5c")
        if 0x40 <= model <= 0x4F:
            return Generation("EPYC 4005", "Zen 5")
        if 0x50 <= model <= 0x5F or 0x90 <= model <= 0x9F:
            return Generation("Venice", "Zen 6")
    return UNKNOWN


def from_codename(model_name: str) -> Generation:
    """QEMU's CPU models are named like `AMD EPYC-Genoa Processor`."""
    for word, generation, zen in _CODENAMES:
        if re.search(rf"\b{word}\b", model_name):
            return Generation(generation, zen)
    return UNKNOWN


def classify(
    vendor: str, model_name: str, family: int | None, model: int | None
) -> tuple[Generation, list[str]]:
    """The reconciled generation and any warnings about how it was decided."""
    if not is_amd_epyc(vendor, model_name):
        return UNKNOWN, []
    by_cpuid = from_cpuid(family, model)
    part = model_number(model_name)
    by_name = from_model_number(part) if part else UNKNOWN
    if by_name.generation != "unknown":
        if by_cpuid.generation == by_name.generation:
            return Generation(by_name.generation, by_cpuid.zen_arch or by_name.zen_arch), []
        if by_cpuid.generation == "unknown" and by_cpuid.zen_arch in (None, by_name.zen_arch):
            return by_name, []
        warnings = []
        if by_cpuid.zen_arch is not None:
            warnings.append(
                f"model name says {by_name.generation} (EPYC {part}) but CPUID family "
                f"{family} model {model} says {by_cpuid.generation} ({by_cpuid.zen_arch}); "
                "going by the name"
            )
        return by_name, warnings
    if by_cpuid.generation != "unknown":
        return by_cpuid, []
    by_codename = from_codename(model_name)
    if by_codename.generation != "unknown":
        return by_codename, []
    if by_cpuid.zen_arch == "Zen 4c":
        return by_cpuid, [
            f"CPUID family {family} model {model} is a Zen 4c part (Bergamo or Siena); "
            f"the model name {model_name!r} does not say which"
        ]
    return UNKNOWN, [
        f"cannot tell the EPYC generation of {model_name!r} (CPUID family {family} model {model})"
    ]


def is_supported(generation: str) -> bool:
    return generation in SUPPORTED_GENERATIONS
