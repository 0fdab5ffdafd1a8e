"""One endpoint-file key's row (`KeySetting`), and an engine's share of the keys
(`EngineKeys`: `KEYS` in its package's `spec.py`). The rows are put together in
`epycd.spec.keys`; this module imports no engine's, so an engine's `spec.py` can import it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, Field

from epycd.engines import DEFAULT_ENGINE
from epycd.engines import ENGINES as REGISTERED

ENGINES = (DEFAULT_ENGINE.name, *(e.name for e in REGISTERED if e is not DEFAULT_ENGINE))
"""The registered engines (`epycd.engines`), the default first."""
AUTO_ENGINE = "auto"
"""`engine = "auto"`: the planner chooses the engine (epycd.plan.pipeline.choose)."""
ENGINE_VALUES = (*ENGINES, AUTO_ENGINE)
"""The values of `engine`: an engine, or "auto"."""
DEVICES = ("cpu", "instinct")
"""The values of `device`, the default first."""
PathText = Annotated[str, Field(min_length=2, pattern=r"^/")]
"""An absolute path, as a key takes one."""
CPU_ONLY = ("cpu",)
INSTINCT_ONLY = ("instinct",)


@dataclass(frozen=True)
class KeySetting:
    """One key of the endpoint file."""

    name: str
    allowed: str
    """What it takes: the fix of the error for a wrong value."""
    doc: str
    """What it is for, as docs/admin.md's table says it (Markdown)."""
    engines: tuple[str, ...] = ENGINES
    """The engines it applies to."""
    devices: tuple[str, ...] = DEVICES
    """The devices it applies to."""
    harmless: tuple[object, ...] = ()
    """Values accepted where the key does not apply: its default, written out."""
    fixes: Mapping[str, str] = field(default_factory=dict)
    """Engine or device it does not apply to -> the fix an admin is given there."""

    def applies(self, engine: str, device: str) -> bool:
        """Under `engine = "auto"` a key applies where it applies to every engine the
        planner may choose (or where its row names "auto")."""
        if engine == AUTO_ENGINE and engine not in self.engines:
            return set(ENGINES) <= set(self.engines) and device in self.devices
        return engine in self.engines and device in self.devices

    def fix_for(self, engine: str, device: str) -> str:
        """The fix where it does not apply: the row's own for that engine or device, else
        the engine or device to set."""
        where = engine if engine not in self.engines else device
        if where in self.fixes:
            return self.fixes[where]
        if engine not in self.engines:
            return f'set engine = "{self.engines[0]}", or remove {self.name}'
        return f'set device = "{self.devices[0]}", or remove {self.name}'


@dataclass(frozen=True)
class EngineKeys:
    """An engine's share of the endpoint file's keys: its own keys' rows, which follow the
    `engine` row, and the fix for each shared key it does not take (its row lists the
    engines that take it, or every engine). `KEYS` in the engine's package's `spec.py`."""

    own: tuple[KeySetting, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    """A shared key it does not take -> the fix its endpoint files are given."""
    fields: type[BaseModel] | None = None
    """The types and defaults of its own keys: a model `EndpointSpec` is extended with
    (`epycd.spec.spec_model`), with the same config (frozen, strict, no extra keys)."""
