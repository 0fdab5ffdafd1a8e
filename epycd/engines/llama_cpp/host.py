"""A llama-server executable: the one `install.sh --engine llama.cpp` built in the llama.cpp
runtime's folder (`embedded_llama_server`), or one an endpoint file names (`llama_server`),
asked its version by running `llama-server --version` (it prints it and exits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from epycd.childproc import run_bounded
from epycd.host.facts import ServerFacts

VERSION_TIMEOUT_S = 5
"""`llama-server --version` loads its backends and prints a few lines: well under a second."""
STAMP = ".epyc-stamp"
"""packaging/llama-runtime.sh's record of the source it built, in the runtime's folder."""


def embedded_llama_server(runtime_dir: Path) -> str | None:
    """The llama.cpp runtime's `llama-server`, where its recipe finished (its stamp is there)."""
    server = runtime_dir / "bin" / "llama-server"
    finished = (runtime_dir / STAMP).is_file()
    return str(server) if finished and os.access(server, os.X_OK) else None


def probe_llama_server(path: str) -> ServerFacts:
    """The server at `path` and its version line; `present` False with why it cannot run."""
    if not os.access(path, os.X_OK) or not Path(path).is_file():
        return ServerFacts(path=path, present=False, error="no executable file there")
    try:
        done = run_bounded(
            [path, "--version"],
            timeout=VERSION_TIMEOUT_S,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    except (OSError, subprocess.SubprocessError) as error:
        return ServerFacts(path=path, present=False, error=str(error))
    lines = (done.stdout + done.stderr).splitlines()
    version = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("version:")), None
    )
    if done.returncode != 0 or version is None:
        tail = lines[-1] if lines else f"exit {done.returncode}"
        return ServerFacts(path=path, present=False, error=f"--version failed: {tail}")
    return ServerFacts(path=path, present=True, version=version)
