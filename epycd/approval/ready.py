"""The readiness gate of a multi-instance endpoint's balancer (docs/instances.md), run by
its unit before HAProxy starts:

    python -m epycd.approval.ready NAME

The balancer starts after its instances have started or failed (`After=`); this counts the
approved set's instances that systemd reports active (each passed its health gate, Type=
notify) and exits 0 when at least `min_ready` are, else 1 with one line naming those that
are not, so that the balancer's start, and `epycctl approve`'s, fails. 2: no approval of a
set for NAME.
"""

from __future__ import annotations

from epycd import systemd
from epycd.approval.gate import gate_command
from epycd.approval.record import load_approval
from epycd.errors import InputError
from epycd.names import unit_name
from epycd.settings import Settings

MODULE = "epycd.approval.ready"


def ready_check(settings: Settings, name: str) -> tuple[int, str]:
    """(exit code, the one line to print)."""
    approval = load_approval(settings, name)
    if approval is None or approval.plan.instances is None:
        raise InputError(
            f"no approved multi-instance endpoint {name}",
            fix=f"run `epycctl approve {name}`",
        )
    chosen = approval.plan.instances
    units = [f"{member.unit_name}.service" for member in chosen.members]
    states = {unit: systemd.is_active(unit) for unit in units}
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
