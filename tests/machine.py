"""The machine the tests run on, read independently of epycd, and the host root that tests
serving a real vLLM plan against.

Test machines differ: AMD Zen4 or Zen5 VMs (model name just "AMD EPYC"), sometimes an Intel
Xeon, any core count, one NUMA node whose meminfo may differ from /proc/meminfo. A test that
expects something of the real machine computes it here, from /proc/cpuinfo and sysfs, with
code that shares nothing with epycd/host, so the two check each other.

Where the product would refuse the real host (not an AMD EPYC), tests that must serve plan
against `serving_root()`: this machine's own CPU lists, NUMA nodes and live memory files (so
vLLM's own per-node memory check sees what the plan saw) under an EPYC identity. On a real
EPYC it is `/` itself, so the real path stays covered wherever it can be.
`EPYC_TEST_HOST=epyc-identity` forces the identity root on any machine,
`EPYC_TEST_HOST=milan-identity` forces a Milan identity (Zen 3: no AVX-512, so the routes of a
CPU without AVX-512 BF16: the stock vLLM path with consent, llama.cpp first for auto), and
`EPYC_TEST_VLLM=stock` the stock vLLM platform, to try those paths where they would not run:

    EPYC_TEST_HOST=epyc-identity EPYC_TEST_VLLM=stock .venv/bin/python -m pytest
    EPYC_TEST_HOST=milan-identity EPYC_TEST_VLLM=stock .venv/bin/python -m pytest
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
HOST_SETTING = os.environ.get("EPYC_TEST_HOST", "")
FORCE_IDENTITY = HOST_SETTING in ("epyc-identity", "milan-identity")
FORCE_STOCK = os.environ.get("EPYC_TEST_VLLM") == "stock"
"""`EPYC_TEST_VLLM=stock`: tests serve through the real vLLM with zentorch hidden
(tests/health/realvllm.py), so a Zen machine runs the suite as an Intel one would."""


@dataclass(frozen=True)
class Identity:
    """The CPU an identity root shows, as clouds present it: the name without a part
    number, the CPUID family and model, and the AVX-512 flags it has (the real CPU's
    AVX-512 flags are dropped, the rest kept)."""

    generation: str
    family: int
    model: int
    avx512_flags: tuple[str, ...]
    name: str = "AMD EPYC"

    @property
    def bf16(self) -> bool:
        return "avx512_bf16" in self.avx512_flags


GENOA = Identity(
    "Genoa", 25, 17, ("avx512f", "avx512_bf16", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")
)
MILAN = Identity("Milan", 25, 1, ())
IDENTITY = MILAN if HOST_SETTING == "milan-identity" else GENOA
"""The identity root is a Genoa VM unless `EPYC_TEST_HOST=milan-identity` asks for a Milan."""

SUPPORTED = frozenset({"Genoa", "Turin", "Venice"})

# CPUID ranges, written again from the public AMD table so that a slip in one copy shows:
# (family, first model, last model) -> (generation, Zen architecture).
CPUID_TABLE: tuple[tuple[int, int, int, str, str], ...] = (
    (0x17, 0x00, 0x0F, "Naples", "Zen 1"),
    (0x17, 0x30, 0x3F, "Rome", "Zen 2"),
    (0x19, 0x00, 0x0F, "Milan", "Zen 3"),
    (0x19, 0x10, 0x1F, "Genoa", "Zen 4"),
    (0x19, 0x60, 0x6F, "EPYC 4004", "Zen 4"),
    (0x1A, 0x00, 0x0F, "Turin", "Zen 5"),
    (0x1A, 0x10, 0x1F, "Turin", "Zen 5c"),
    (0x1A, 0x40, 0x4F, "EPYC 4005", "Zen 5"),
    (0x1A, 0x50, 0x5F, "Venice", "Zen 6"),
    (0x1A, 0x90, 0x9F, "Venice", "Zen 6"),
)
NAME_RULE = {
    ("4", "4"): "EPYC 4004", ("4", "5"): "EPYC 4005", ("7", "1"): "Naples",
    ("7", "2"): "Rome", ("7", "3"): "Milan", ("8", "4"): "Siena", ("9", "5"): "Turin",
    ("9", "6"): "Venice",
}  # fmt: skip


@dataclass(frozen=True)
class RealCpu:
    """The first processor block of /proc/cpuinfo."""

    vendor: str
    name: str
    family: int
    model: int
    flags: frozenset[str]

    @property
    def is_amd_epyc(self) -> bool:
        return self.vendor == "AuthenticAMD" and "EPYC" in self.name

    @property
    def generation(self) -> str:
        """What an EPYC's generation must come out as; "unknown" for anything else."""
        if not self.is_amd_epyc:
            return "unknown"
        part = re.search(r"EPYC\s+(\d[0-9A-Z]{2}\d)\b", self.name)
        if part:
            digits = part.group(1)
            if (digits[0], digits[-1]) == ("9", "4"):
                return "Bergamo" if digits[1] == "7" else "Genoa"
            by_name = NAME_RULE.get((digits[0], digits[-1]))
            if by_name:
                return by_name
        for family, first, last, generation, _zen in CPUID_TABLE:
            if family == self.family and first <= self.model <= last:
                return generation
        return "unknown"

    @property
    def is_supported_epyc(self) -> bool:
        return self.generation in SUPPORTED


def _field(block: str, name: str) -> str:
    found = re.search(rf"^{re.escape(name)}\s*:\s*(.*)$", block, re.M)
    return found.group(1).strip() if found else ""


@cache
def real_cpu() -> RealCpu:
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    return RealCpu(
        vendor=_field(first, "vendor_id"),
        name=_field(first, "model name"),
        family=int(_field(first, "cpu family") or -1),
        model=int(_field(first, "model") or -1),
        flags=frozenset(_field(first, "flags").split()),
    )


def expand(cpulist: str) -> list[int]:
    """A kernel CPU list (`0-3,8`) as numbers; written apart from epycd's parser."""
    out: list[int] = []
    for part in filter(None, cpulist.strip().split(",")):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def online_cpus() -> list[int]:
    return expand((SYS_CPU / "online").read_text())


def physical_cpus() -> list[int]:
    """The first hardware thread of every online core (SMT siblings dropped)."""
    firsts = set()
    for cpu in online_cpus():
        siblings = SYS_CPU / f"cpu{cpu}/topology/thread_siblings_list"
        firsts.add(expand(siblings.read_text())[0] if siblings.exists() else cpu)
    return sorted(firsts)


def socket_of(cpu: int) -> int:
    package = SYS_CPU / f"cpu{cpu}/topology/physical_package_id"
    return int(package.read_text()) if package.exists() else 0


def physical_cpus_of_socket(socket: int) -> list[int]:
    return [cpu for cpu in physical_cpus() if socket_of(cpu) == socket]


def serving_needs_identity() -> bool:
    """The product refuses anything but an AMD EPYC: serve on an identity root there."""
    return FORCE_IDENTITY or not real_cpu().is_amd_epyc


def _identity_cpuinfo(identity: Identity) -> str:
    """The real /proc/cpuinfo (every CPU's placement kept) with the CPU identity replaced."""
    replaced = {
        "vendor_id": "AuthenticAMD",
        "cpu family": str(identity.family),
        "model": str(identity.model),
        "model name": identity.name,
    }
    lines = []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key = line.split(":", 1)[0].strip()
        if key in replaced:
            line = f"{key}\t: {replaced[key]}"
        elif key == "flags":
            kept = [f for f in line.split(":", 1)[1].split() if not f.startswith("avx512")]
            line = f"flags\t\t: {' '.join([*kept, *identity.avx512_flags])}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_identity_root(root: Path, identity: Identity = IDENTITY) -> Path:
    """This machine under an EPYC identity: proc/cpuinfo rewritten, everything else linked to
    the live files (CPU topology, NUMA nodes and their meminfo, /proc/meminfo, /proc/stat)."""
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "sys/devices/system").mkdir(parents=True, exist_ok=True)
    (root / "proc/cpuinfo").write_text(_identity_cpuinfo(identity))
    for name in ("meminfo", "stat"):
        (root / "proc" / name).symlink_to(f"/proc/{name}")
    (root / "sys/devices/system/cpu").symlink_to(SYS_CPU)
    if SYS_NODE.is_dir():
        (root / "sys/devices/system/node").symlink_to(SYS_NODE)
    return root


def serving_root(folder: Path) -> Path:
    """`/` on an AMD EPYC; else (or when forced) an identity root written under `folder`."""
    if not serving_needs_identity():
        return Path("/")
    root = folder / "epyc-identity"
    return root if (root / "proc/cpuinfo").is_file() else write_identity_root(root)


def vllm_runs_zen_here(stock: bool = FORCE_STOCK) -> bool:
    """What vLLM's platform choice must give on this machine: `ZenCpuPlatform` where the
    CPU is AMD with AVX-512 and zentorch imports (the venv ships it, unless hidden)."""
    cpu = real_cpu()
    avx512 = any(flag.startswith("avx512") for flag in cpu.flags)
    return not stock and cpu.vendor == "AuthenticAMD" and avx512


@dataclass(frozen=True)
class Serving:
    """What a plan for a real host vLLM on `root` must come out as, worked out from the
    machine: the generation the root shows, whether the real vLLM runs the Zen platform."""

    root: Path
    generation: str
    bf16: bool
    zen_platform: bool

    @property
    def backend(self) -> str:
        return "zentorch" if self.zen_platform and self.bf16 else "stock"

    @property
    def needs_consent(self) -> bool:
        """Consent unless the validated zentorch path runs; Venice off the pinned vLLM (the
        venv is 0.32, the pin older) needs it too."""
        validated = self.generation in SUPPORTED and self.backend == "zentorch"
        return not validated or self.generation == "Venice"

    @property
    def consent_args(self) -> list[str]:
        return ["--accept-unvalidated"] if self.needs_consent else []


def consent_on(generation: str, bf16: bool = True) -> list[str]:
    """What `epycctl approve` must be given for a plan of this machine's real host vLLM on a
    fake host of `generation` (its venv has zentorch on a Zen machine only)."""
    return Serving(Path("/"), generation, bf16, vllm_runs_zen_here()).consent_args


def serving(folder: Path, *, stock: bool = FORCE_STOCK) -> Serving:
    """The serving root (see `serving_root`) and what plans on it must say."""
    root = serving_root(folder)
    if root == Path("/"):
        cpu = real_cpu()
        generation, bf16 = cpu.generation, "avx512_bf16" in cpu.flags
    else:
        generation, bf16 = IDENTITY.generation, IDENTITY.bf16
    return Serving(root, generation, bf16, vllm_runs_zen_here(stock))


@dataclass(frozen=True)
class E2eRoute:
    """The vLLM route an end-to-end machine serves, and what its plan must say: `identity`,
    the CPU its identity root shows (None: the machine's own /); `hide_zentorch`, whether it
    serves with the venv's vLLM with zentorch hidden (`tests/health/realvllm.py`)."""

    identity: Identity | None
    hide_zentorch: bool
    serving: Serving


def e2e_route(kind: Literal["native", "stock"], folder: Path) -> E2eRoute:
    """`native`: the route this machine takes (the zentorch one where the CPU has AVX-512
    BF16 and is an EPYC, else the stock one; as forced by EPYC_TEST_HOST/EPYC_TEST_VLLM).
    `stock`: the route of an EPYC without AVX-512 BF16 (a Milan) on every machine: the real
    CPU where it is one, else a Milan identity root, and vLLM with zentorch hidden, so the
    stock route runs for real on a Zen 4/5 or an Intel machine too."""
    if kind == "native":
        identity = IDENTITY if serving_needs_identity() else None
        return E2eRoute(identity, FORCE_STOCK, serving(folder, stock=FORCE_STOCK))
    cpu = real_cpu()
    if not FORCE_IDENTITY and cpu.is_amd_epyc and "avx512_bf16" not in cpu.flags:
        return E2eRoute(None, True, Serving(Path("/"), cpu.generation, False, False))
    root = folder / "milan-identity"
    if not (root / "proc/cpuinfo").is_file():
        write_identity_root(root, MILAN)
    return E2eRoute(MILAN, True, Serving(root, MILAN.generation, False, False))
