"""What systemd says about the endpoints' units: one `systemctl show` for all of them."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from epycd.approval.record import Approval
from epycd.names import unit_name

SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "UnitFileState")
STARTING_UNIT_STATES = frozenset({"activating", "reloading"})


class UnitState(BaseModel):
    """What `systemctl show` says about one unit; "unknown" when systemd could not answer."""

    unit: str
    load: str = "unknown"
    active: str = "unknown"
    sub: str = ""
    result: str = ""
    unit_file: str = ""

    @property
    def known(self) -> bool:
        return self.active != "unknown" and self.load != "not-found"


def main_unit(name: str, approval: Approval | None = None) -> str:
    """The unit systemd runs for the endpoint (Quadlet generates NAME.service too)."""
    return f"{approval.unit_name if approval else unit_name(name)}.service"


def parse_show(text: str) -> dict[str, UnitState]:
    """`systemctl show -p Id,... A B` output: one block per unit, blank-line separated."""
    states: dict[str, UnitState] = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        unit = fields.get("Id")
        if not unit:
            continue
        states[unit] = UnitState(
            unit=unit,
            load=fields.get("LoadState") or "unknown",
            active=fields.get("ActiveState") or "unknown",
            sub=fields.get("SubState", ""),
            result=fields.get("Result", ""),
            unit_file=fields.get("UnitFileState", ""),
        )
    return states


def read_unit_states(units: Sequence[str]) -> dict[str, UnitState]:
    """One `systemctl show` for every unit; all "unknown" when systemd cannot answer."""
    from epycd import systemd

    unknown = {unit: UnitState(unit=unit) for unit in units}
    if not units:
        return unknown
    try:
        text = systemd.run(
            "systemctl",
            ["show", "--property=" + ",".join(SHOW_PROPERTIES), *units],
            timeout=systemd.QUERY_TIMEOUT_S,
        ).stdout
    except systemd.SystemdError:
        return unknown
    return unknown | {unit: state for unit, state in parse_show(text).items() if unit in unknown}
