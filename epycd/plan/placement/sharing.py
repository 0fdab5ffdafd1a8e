"""What the endpoints of one planning run share out (`Sharing`), and what every endpoint is
planned with: the host, the stack, the settings, the HF cache, the product's Python, the
unit renderer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from epycd.host.facts import HostFacts
from epycd.plan.endpoint import UnitRenderer
from epycd.plan.model import HfCacheMount
from epycd.plan.placement.ports import Listener
from epycd.plan.placement.reservations import Reservations
from epycd.settings import Settings
from epycd.stack import Stack


@dataclass
class Sharing:
    """What the endpoints share out: the host's sockets and ports, and the approvals that
    already hold some of them."""

    host: HostFacts
    stack: Stack
    settings: Settings
    listeners: Mapping[int, Listener]
    hf_cache: HfCacheMount
    product_python: str
    render: UnitRenderer
    reservations: Reservations = field(default_factory=Reservations)
