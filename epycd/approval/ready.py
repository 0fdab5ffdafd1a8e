"""The readiness gate of a multi-instance endpoint's balancer (docs/instances.md), run by
its unit before HAProxy starts:

    python -m epycd.approval.ready NAME

The balancer starts after its instances have started or failed (`After=`); this counts the
approved set's instances that systemd reports active (each passed its health gate, Type=
notify) and exits 0 when at least `min_ready` are. While fewer are and an instance that is
not is still `activating` (starting, or waiting to restart after a failure: instances
restart by themselves, docs/healing.md), it waits for it, within the balancer's start budget
(epycd.plan.healing.balancer_start_s). Once none that is down can still come up it exits 1
with one line naming them, so that the balancer's start, and `epycctl approve`'s, fails. 2:
no approval of a set for NAME.

Waiting matters on systemd 252: a balancer that failed and restarts by itself restarts
every instance `PartOf=` it, healthy ones too, so it must not fail while an instance is only
on its way back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from epycd import systemd
from epycd.approval.gate import gate_command
from epycd.approval.record import load_approval
from epycd.errors import InputError
from epycd.names import unit_name
from epycd.settings import Settings

MODULE = "epycd.approval.ready"
POLL_S = 2.0
COMING_UP = frozenset({"activating", "reloading"})
"""`systemctl is-active` of an instance still starting, or waiting out RestartSec=."""


def settled_states(
    units: list[str], min_ready: int, sleep: Callable[[float], None] = time.sleep
) -> dict[str, str]:
    """The instances' states once `min_ready` are active or none that is not can come up."""
    while True:
        states = {unit: systemd.is_active(unit) for unit in units}
        ready = sum(1 for state in states.values() if state == "active")
        if ready >= min_ready or not COMING_UP & set(states.values()):
            return states
        sleep(POLL_S)


def ready_check(settings: Settings, name: str) -> tuple[int, str]:
    """(exit code, the one line to print)."""
    approval = load_approval(settings, name)
    if approval is None or approval.plan.instance_set is None:
        raise InputError(
            f"no approved multi-instance endpoint {name}",
            fix=f"run `epycctl approve {name}`",
        )
    chosen = approval.plan.instance_set
    units = [f"{member.unit_name}.service" for member in approval.plan.decisions.members]
    states = settled_states(units, chosen.min_ready)
    ready = [unit for unit, state in states.items() if state == "active"]
    balancer = f"{unit_name(name)}.service"
    if len(ready) >= chosen.min_ready:
        return 0, f"{balancer}: {len(ready)} of {len(units)} instances ready"
    down = ", ".join(f"{unit} ({states[unit]})" for unit in units if unit not in ready)
    return 1, (
        f"{balancer}: {len(ready)} of {len(units)} instances ready, fewer than min_ready = "
        f"{chosen.min_ready}: {down}; `epycctl status {name}` says why"
    )


main = gate_command(
    "epycd-ready-check",
    ready_check,
    lambda name: f"{unit_name(name)}.service: ready check failed",
    "Refuse to start the balancer of NAME while fewer than min_ready instances are up.",
)


if __name__ == "__main__":
    main()
