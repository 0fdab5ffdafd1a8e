"""A kernel OOM kill of one chosen process, for the fault tests: the victim is moved into a
memory cgroup of its own with a small limit, a balloon process in the same cgroup grows past
that limit, and the kernel's OOM killer (not a signal of the test's) ends the victim.

The kernel picks by its own rule, the largest resident task of the cgroup: the engine, whose
weights and KV pool dwarf the balloon. A task's old charges do not move with it (Linux 6.x
refuses `memory.move_charge_at_immigrate`), so killing the victim frees nothing inside the
cgroup and the killer ends the balloon next; the victim's death is what the test is after.
The test machines mount cgroup v1's memory controller (a hybrid hierarchy), used here; a
machine with none says so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

V1_MEMORY = Path("/sys/fs/cgroup/memory")
LIMIT = 64 * 1024 * 1024
"""The cgroup's limit: the balloon's first chunks fit, the rest not."""
BALLOON = """
import os, sys, time
victim = int(sys.argv[1])
chunks = []
print("inflating", flush=True)
while len(chunks) < 256:
    try:
        os.kill(victim, 0)
    except ProcessLookupError:
        break
    chunks.append(bytearray(8 * 1024 * 1024))
    time.sleep(0.01)
print("victim gone" if len(chunks) < 256 else "victim alive", flush=True)
"""


def memcg_problem() -> str | None:
    """Why a kernel OOM kill cannot be made here, or None."""
    if os.geteuid() != 0:
        return "a memory cgroup is made as root"
    if not (V1_MEMORY / "memory.limit_in_bytes").is_file():
        return f"no cgroup v1 memory controller at {V1_MEMORY}"
    return None


@contextlib.contextmanager
def memory_cgroup() -> Iterator[Path]:
    group = V1_MEMORY / f"epyc-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (V1_MEMORY / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            group.rmdir()


@dataclass
class OomKill:
    oom_kills: int
    """The cgroup's own count of the kernel's OOM kills (memory.oom_control's oom_kill)."""
    balloon: str


def _gone_or_zombie(pid: int) -> bool:
    """The process has exited: reaped (its /proc entry gone, also between two reads), or a
    zombie its parent has not reaped yet."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def oom_kill(victim: int, timeout: float = 60) -> OomKill:
    """The kernel's OOM killer ends `victim` over its cgroup's limit; what the kernel counted
    (`oom_kill` of the cgroup) and what the balloon said (killed after the victim, or not)."""
    with memory_cgroup() as group:
        (group / "cgroup.procs").write_text(str(victim))
        (group / "memory.limit_in_bytes").write_text(str(LIMIT))
        balloon = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os; open('{group}/cgroup.procs','w').write(str(os.getpid()))\n" + BALLOON,
                str(victim),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            out, _ = balloon.communicate(timeout=timeout)
        finally:
            if balloon.poll() is None:
                balloon.kill()
                balloon.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _gone_or_zombie(victim):
            time.sleep(0.05)
        control = (group / "memory.oom_control").read_text()
        kills = int(dict(line.split() for line in control.splitlines()).get("oom_kill", "0"))
        return OomKill(oom_kills=kills, balloon=out.strip())
