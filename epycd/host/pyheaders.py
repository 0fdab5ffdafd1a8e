"""The Python headers of the interpreter that serves a host vLLM (docs/tuning.md rule 4).

torch's inductor builds its C++ kernels against `Python.h`, so a host vLLM serves compiled
only where the interpreter that runs it has its headers (Debian ships them apart, in
python3.X-dev). Everything is read from the files of the host at `root` (a folder describing
another host in tests), never by running the interpreter, and every path is resolved inside
that root, its symlinks included:

- the `vllm` script's shebang names its interpreter (pip's `#!/bin/sh` + `'''exec'` form for
  long paths, and `#!/usr/bin/env python3` looked up on systemd's default PATH, too);
- a venv (a pyvenv.cfg in the parent of the interpreter's bin/) runs its base interpreter,
  whose prefix is the parent of pyvenv.cfg's `home`; any other interpreter's prefix is the
  parent of its (resolved) bin/;
- the headers are PREFIX/include/python3.X/Python.h, X from pyvenv.cfg (`version`,
  `version_info`) or the interpreter's name; any python3.* include folder when neither tells.

Not known (present None) when the script or its interpreter cannot be read there, or the
script is not run by a Python (a shell wrapper): the plan then decides as without this check.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path, PurePosixPath

from epycd.host.facts import HostVllmFacts, PythonHeaders
from epycd.host.files import SYSTEMD_DEFAULT_PATH
from epycd.readfile import STATE_MAX_BYTES, read_head, read_text

MAX_LINKS = 32
"""Symlinks followed while resolving one path, as the kernel's ELOOP limit (40) roughly."""
PIP_SH_EXEC = re.compile(r"""^'''exec' (?:"([^"]+)"|(\S+))""")
"""pip/distlib's launcher for an interpreter path too long for a shebang (or with spaces):
`#!/bin/sh` then `'''exec' "/path/python" "$0" "$@"`."""
_NAME_VERSION = re.compile(r"^python(\d+\.\d+)")
_CFG_VERSION = re.compile(r"^(\d+)\.(\d+)")


def under(root: Path, path: PurePosixPath | str) -> Path:
    """Where the host's absolute `path` is in this process's view of the host at `root`."""
    return root / str(path).lstrip("/")


def host_realpath(root: Path, path: PurePosixPath | str) -> PurePosixPath:
    """The host's absolute `path` with every symlink followed inside the host at `root`
    (an absolute link target is the host's, not this machine's); OSError on a loop."""
    pending = list(PurePosixPath("/", path).parts[1:])
    resolved = PurePosixPath("/")
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            resolved = resolved.parent
            continue
        candidate = resolved / part
        local = under(root, candidate)
        if not local.is_symlink():
            resolved = candidate
            continue
        links += 1
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", str(path))
        target = PurePosixPath(os.readlink(local))
        if target.is_absolute():
            resolved = PurePosixPath("/")
            pending[:0] = list(target.parts[1:])
        else:
            pending[:0] = list(target.parts)
    return resolved


def _head(local: Path) -> list[str]:
    lines = read_head(local, 8192).split(b"\n")[:2]
    lines += [b""] * (2 - len(lines))
    return [line[:4096].decode("utf-8", errors="replace").strip() for line in lines]


def _on_service_path(root: Path, name: str) -> PurePosixPath | None:
    for folder in SYSTEMD_DEFAULT_PATH.split(":"):
        candidate = PurePosixPath(folder) / name
        if under(root, candidate).is_file():
            return candidate
    return None


def shebang_interpreter(root: Path, script: PurePosixPath) -> PurePosixPath | None:
    """The interpreter the host runs `script` with, as its shebang names it (None: none)."""
    first, second = _head(under(root, script))
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if not words:
        return None
    command = PurePosixPath(words[0])
    if command.name == "env":
        names = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        return _on_service_path(root, names[0]) if names else None
    if command.name == "sh" and (launcher := PIP_SH_EXEC.match(second)):
        return PurePosixPath(launcher.group(1) or launcher.group(2))
    return command


def read_pyvenv_cfg(local: Path) -> dict[str, str]:
    """pyvenv.cfg's `key = value` lines (venv, virtualenv and uv all write this form)."""
    values = {}
    for line in read_text(local, STATE_MAX_BYTES, errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip().lower()] = value.strip()
    return values


def _cfg_version(cfg: dict[str, str]) -> str | None:
    for key in ("version", "version_info"):
        if match := _CFG_VERSION.match(cfg.get(key, "")):
            return f"{match.group(1)}.{match.group(2)}"
    return None


def _name_version(interpreter: PurePosixPath) -> str | None:
    match = _NAME_VERSION.match(interpreter.name)
    return match.group(1) if match else None


def find_headers(
    root: Path, prefix: PurePosixPath, version: str | None
) -> tuple[bool, PurePosixPath]:
    """(found, the Python.h found or looked for) under PREFIX/include: python3.X (with any
    ABI letters, 3.13t, 3.7m), or any python3.* when the version is not known."""
    include = prefix / "include"
    wanted = re.compile(
        rf"^python{re.escape(version)}[a-z]*$" if version else r"^python3\.\d+[a-z]*$"
    )
    try:
        names = sorted(entry.name for entry in under(root, include).iterdir())
    except OSError:
        names = []
    for name in names:
        if wanted.match(name) and under(root, include / name / "Python.h").is_file():
            return True, include / name / "Python.h"
    return False, include / f"python{version or '3.*'}" / "Python.h"


def _unknown(vllm: str, note: str, interpreter: PurePosixPath | None = None) -> PythonHeaders:
    return PythonHeaders(
        vllm=vllm, interpreter=str(interpreter) if interpreter else None, note=note
    )


def _serving(root: Path, named: PurePosixPath) -> tuple[PurePosixPath, PurePosixPath, str | None]:
    """(the interpreter that really runs, its prefix, its version) for the interpreter a
    shebang names: a venv's base interpreter, else the interpreter with its links followed."""
    venv = host_realpath(root, named.parent).parent
    cfg_file = under(root, venv / "pyvenv.cfg")
    if cfg_file.is_file():
        cfg = read_pyvenv_cfg(cfg_file)
        home = cfg.get("home", "")
        if home.startswith("/"):
            version = _cfg_version(cfg)
            executable = cfg.get("executable", "")
            base = (
                PurePosixPath(executable)
                if executable.startswith("/")
                else PurePosixPath(home) / (f"python{version}" if version else "python3")
            )
            version = version or _name_version(base) or _name_version(named)
            return base, host_realpath(root, home).parent, version
    real = host_realpath(root, named)
    return real, real.parent.parent, _name_version(real) or _name_version(named)


def python_headers(root: Path, vllm: str) -> PythonHeaders:
    """Whether the interpreter that runs the host's `vllm` has its Python.h. Never raises."""
    if not vllm.startswith("/"):
        return _unknown(vllm, f"{vllm} is not an absolute path")
    try:
        script = host_realpath(root, vllm)
        named = shebang_interpreter(root, script)
        if named is None or not named.is_absolute():
            return _unknown(vllm, f"{vllm} has no usable shebang")
        if not named.name.startswith("python"):
            return _unknown(vllm, f"{vllm} is run by {named}, not by a Python", named)
        interpreter, prefix, version = _serving(root, named)
        if not under(root, host_realpath(root, interpreter)).is_file():
            return _unknown(vllm, f"no interpreter {interpreter}", interpreter)
        present, header = find_headers(root, prefix, version)
    except (OSError, ValueError) as error:
        return _unknown(vllm, f"{vllm}: {getattr(error, 'strerror', None) or error}")
    return PythonHeaders(
        vllm=vllm,
        interpreter=str(interpreter),
        prefix=str(prefix),
        version=version,
        header=str(header),
        present=present,
    )


def with_python_headers(facts: HostVllmFacts, root: Path) -> HostVllmFacts:
    """A probed host vLLM with its serving interpreter's headers, read under `root` now
    (installing python3-dev changes no venv, so this is never taken from the probe cache)."""
    if not facts.present:
        return facts
    return facts.model_copy(update={"python_headers": python_headers(root, facts.path)})
