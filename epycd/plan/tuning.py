"""The tuning rules every engine's plan shares (docs/tuning.md; rule numbers match): the
profiles, the OS's share of a socket's memory (rule 3) and the unit's limits (rule 5). Each
engine's own rules are in its package (vLLM's, with the OpenMP bind of rule 1:
`epycd.engines.vllm.plan.tuning`)."""

from __future__ import annotations

from typing import Literal

Profile = Literal["balanced", "latency", "throughput"]
PROFILES: tuple[Profile, ...] = ("balanced", "latency", "throughput")
DEFAULT_PROFILE: Profile = "balanced"

LIMIT_NOFILE = 65536
"""Rule 5: vLLM raises its soft open-file limit to 65535 at start and warns when it cannot
(vllm/utils/system_utils.py set_ulimit); the hard limit systemd gives a service is 524288, the
soft 1024."""
LIMIT_MEMLOCK = "infinity"
"""Rule 5: locked memory unbounded, as container engines run vLLM (`--ulimit memlock=-1`)."""


def headroom_gib(socket_total_gib: float) -> float:
    """The OS's share, apart from the server's tree: 10 % of the socket, 2 to 16 GiB.

    The recipe reserves a flat 16 GB, which on a 16-32 GiB socket leaves nothing for weights
    and KV; 10 % keeps small sockets usable and reaches the recipe's 16 GiB from 160 GiB up.
    """
    return min(16.0, max(2.0, 0.1 * socket_total_gib))
