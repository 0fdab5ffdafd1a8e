"""vLLM's endpoint-file keys (`EngineKeys`): none of its own beyond the shared rows of
`epycd.spec.keys`, which were written for it and list it (`engines`) where only vLLM takes
one."""

from __future__ import annotations

from epycd.spec.key_setting import EngineKeys

KEYS = EngineKeys()
