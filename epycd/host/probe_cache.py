"""Host vLLM probes kept across commands in `RUN_DIR/vllm-probes.json`.

A probe imports vLLM in the environment's own interpreter: ~19 s on the 2-core test machine,
paid by every `plan`, `approve`, `status` and `quickstart` before this cache. The answer only
changes when that environment is reinstalled, so an entry is keyed by the vllm executable's
resolved path, size and modification time and by the same three of its interpreter (pip
rewrites the `vllm` script on every install; a venv rebuilt over another Python changes the
interpreter). An entry holds the facts the probe reported (version, platform, zentorch; an
entry without zentorch, from before the probe asked, is probed again); the model
stage keeps vLLM's model registry beside it (`remember`), another import of vLLM. Only good
probes are kept: a broken environment is probed again next time. The run folder is cleared
at boot; a folder this user cannot write only means no caching.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from epycd.host.facts import HostVllmFacts
from epycd.host.vllm_probe import ProbeError, interpreter_of, probe_vllm, resolve_executable
from epycd.readfile import CACHE_MAX_BYTES, read_bytes

PROBE_CACHE = "vllm-probes.json"


def _identity(path: Path) -> str:
    found = path.resolve()
    info = found.stat()
    return f"{found}:{info.st_mtime_ns}:{info.st_size}"


class ProbeCache:
    """`probe(executable)`: the cached facts while the environment is unchanged."""

    def __init__(self, path: Path, prober: Callable[[str], HostVllmFacts] = probe_vllm) -> None:
        self.path = path
        self.prober = prober

    @classmethod
    def in_run_dir(cls, run_dir: Path) -> ProbeCache:
        return cls(run_dir / PROBE_CACHE)

    @staticmethod
    def key(executable: str) -> str | None:
        """The executable's and its interpreter's resolved path, mtime and size."""
        try:
            vllm = resolve_executable(executable)
            return f"{_identity(vllm)}|{_identity(interpreter_of(vllm))}"
        except (ProbeError, OSError):
            return None

    @staticmethod
    def executable_key(executable: str) -> str | None:
        """The executable's part of `key` alone: what a user who may not reach the
        interpreter (a venv under /root, `epycctl status` as a user) can still check."""
        try:
            return _identity(resolve_executable(executable))
        except (ProbeError, OSError):
            return None

    def lookup(self, executable: str, what: str = "") -> tuple[str | None, Any]:
        """(the key to store under, the cached answer or None). Without a full key, an entry
        root stored for the same unchanged executable answers; nothing is stored then."""
        prefix = f"{what}|" if what else ""
        entries = self.load()
        key = self.key(executable)
        if key is not None:
            return key, entries.get(prefix + key)
        part = self.executable_key(executable)
        if part is None:
            return None, None
        found = [value for name, value in entries.items() if name.startswith(f"{prefix}{part}|")]
        return None, found[-1] if found else None

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(read_bytes(self.path, CACHE_MAX_BYTES))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def probe(self, executable: str) -> HostVllmFacts:
        key, cached = self.lookup(executable)
        # an entry from before the probe asked for zentorch is probed again where it can be
        # stored anew; a user who may not reach the interpreter still reads it
        if isinstance(cached, dict) and (key is None or "zentorch_version" in cached):
            try:
                return HostVllmFacts.model_validate(cached)
            except ValidationError:
                pass
        facts = self.prober(executable)
        if key and facts.present and not facts.error:
            self.store(key, facts)
        return facts

    def remember(
        self, executable: str, what: str, compute: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """Another answer of the same environment (vLLM's model registry), kept alike;
        `compute` raising keeps nothing."""
        key, cached = self.lookup(executable, what)
        if isinstance(cached, dict):
            return cached
        answer = compute()
        if key:
            self._write(f"{what}|{key}", answer)
        return answer

    def store(self, key: str, facts: HostVllmFacts) -> None:
        self._write(key, facts.model_dump(mode="json"))

    def _write(self, key: str, value: dict[str, Any]) -> None:
        from epycd.atomic import write_atomic

        data = self.load() | {key: value}
        try:
            write_atomic(self.path, json.dumps(data, indent=1).encode())
        except OSError:
            return
