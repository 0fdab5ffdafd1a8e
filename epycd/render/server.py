"""What each engine does for the renderer (`ServerRenderer`): the last check of one
server's decisions before a unit is written, and that unit's text. One implementation per
engine (`epycd.engines.ENGINE.render`), listed by `epycd.render.engines`; `render_units`
asks it and never names an engine. A set's balancer is the same for every engine
(`epycd.render.balancer`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from epycd.plan.model import AnyServer


class ServerRenderer(ABC):
    """One engine's units."""

    engine: ClassVar[str]
    """Its name (`epycd.engines.Engine.name`)."""

    @abstractmethod
    def check(self, decisions: AnyServer) -> None:
        """Raise `InputError` (naming the key and the fix) on the first rule these decisions
        break: what a unit must never carry, whoever made the decisions."""

    @abstractmethod
    def unit_text(self, decisions: AnyServer) -> str:
        """The exact text of the server's unit (a Quadlet `.container` or a `.service`, by
        its `runtime`), every value quoted by systemd's rules."""
