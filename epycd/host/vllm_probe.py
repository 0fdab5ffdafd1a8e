"""Probe a host (venv/conda) vLLM by running that environment's own interpreter.

Importing vLLM in our own process would pull torch into the daemon and could pick the
wrong environment; a short snippet in the venv's interpreter reports the version, the
platform class vLLM selects (`ZenCpuPlatform` when zentorch matches the host's torch) and the
zentorch distribution's version (the validated pairs are vLLM + zentorch: `Stack.validated_stacks`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from epycd.childproc import OutputTooLarge, run_bounded
from epycd.host.facts import HostVllmFacts
from epycd.readfile import read_head

MARKER = "EPYCD-VLLM-PROBE "
SNIPPET = f"""
import json, vllm
from importlib import metadata
from vllm.platforms import current_platform
try:
    zentorch = metadata.version("zentorch")
except metadata.PackageNotFoundError:
    zentorch = None
facts = {{"version": vllm.__version__, "platform": type(current_platform).__name__,
         "zentorch": zentorch}}
print({MARKER!r} + json.dumps(facts), flush=True)
"""
PROBE_ENV = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}


class ProbeError(Exception):
    pass


def resolve_executable(executable: str) -> Path:
    found = shutil.which(executable) if os.sep not in executable else executable
    if found is None or not Path(found).is_file():
        raise ProbeError(f"{executable}: no such executable")
    return Path(found)


def shebang_interpreter(script: Path) -> Path | None:
    try:
        first = read_head(script, 4096).split(b"\n")[0]
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:
        found = shutil.which(words[-1])
        return Path(found) if found else None
    return Path(words[0])


def interpreter_of(vllm: Path) -> Path:
    """The `python` beside the vllm script (venv/conda bin/), else the script's shebang."""
    for name in ("python", "python3"):
        beside = vllm.parent / name
        if beside.is_file() and os.access(beside, os.X_OK):
            return beside
    interpreter = shebang_interpreter(vllm)
    if interpreter is None or not interpreter.is_file():
        raise ProbeError(f"{vllm}: no python beside it and no usable shebang")
    return interpreter


class ProbeAnswer(NamedTuple):
    version: str
    platform: str
    zentorch_version: str | None


def parse_probe_output(stdout: str) -> ProbeAnswer:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            data = json.loads(line[len(MARKER) :])
            zentorch = data.get("zentorch")
            return ProbeAnswer(
                str(data["version"]),
                str(data["platform"]),
                None if zentorch is None else str(zentorch),
            )
    raise ProbeError("the probe printed no result")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_probe(interpreter: Path, timeout: float) -> ProbeAnswer:
    try:
        done = run_bounded(
            [str(interpreter), "-c", SNIPPET], timeout=timeout, env=os.environ | PROBE_ENV
        )
    except subprocess.TimeoutExpired as error:
        raise ProbeError(f"{interpreter}: importing vllm took over {timeout:g} s") from error
    except OutputTooLarge as error:
        raise ProbeError(f"{interpreter}: importing vllm {error}") from error
    except OSError as error:
        raise ProbeError(f"{interpreter}: {error.strerror or error}") from error
    if done.returncode != 0:
        raise ProbeError(
            f"{interpreter} cannot import vllm (exit {done.returncode}): {last_line(done.stderr)}"
        )
    return parse_probe_output(done.stdout)


def probe_vllm(executable: str, timeout: float = 60) -> HostVllmFacts:
    """Facts about the vLLM behind `executable` (a path or a name on PATH). Never raises."""
    try:
        vllm = resolve_executable(executable)
        answer = run_probe(interpreter_of(vllm), timeout)
    except (ProbeError, ValueError, KeyError) as error:
        return HostVllmFacts(path=executable, present=False, error=str(error))
    except OSError as error:  # e.g. a venv whose interpreter this user may not reach
        reason = f"{error.filename}: {error.strerror}" if error.filename else str(error)
        return HostVllmFacts(path=executable, present=False, error=reason)
    return HostVllmFacts(
        path=str(vllm),
        present=True,
        version=answer.version,
        platform=answer.platform,
        zentorch_version=answer.zentorch_version,
    )
