"""What a host endpoint must read inside /root or /home, which its unit otherwise hides.

The endpoint runs as the user epyc-llm with ProtectHome=: a vLLM venv made from an
interpreter under a home (pyenv, conda in ~), or a model folder or chat template there,
would be out of its reach. These paths (links followed) are handed to the renderer, which
mounts a tmpfs over the homes and binds exactly them back read-only.
"""

from __future__ import annotations

import os
from pathlib import Path

from epycd.readfile import FOREIGN_RECORD_MAX_BYTES, read_text

HIDDEN_HOMES = ("/root", "/home")
"""Hidden from the host endpoints' user (ProtectHome=; /root is root's alone)."""


def in_a_home(path: str) -> bool:
    return any(path == home or path.startswith(home + "/") for home in HIDDEN_HOMES)


def venv_base_prefix(venv: Path) -> Path | None:
    """The prefix of the interpreter a venv was made from (pyvenv.cfg `home` is its bin/)."""
    try:
        text = read_text(venv / "pyvenv.cfg", FOREIGN_RECORD_MAX_BYTES, errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).parent
    return None


def home_read_paths(vllm: str, local_files: list[str]) -> list[str]:
    """The vLLM environment, its base interpreter and the local files, where under a home."""
    venv = Path(os.path.realpath(vllm)).parent.parent
    candidates = [str(venv)]
    base = venv_base_prefix(venv)
    if base is not None:
        candidates.append(os.path.realpath(base))
    candidates += [os.path.realpath(path) for path in local_files]
    found = [path for path in candidates if in_a_home(path)]
    return sorted(set(found))
