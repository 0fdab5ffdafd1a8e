"""Reading host files under a root folder: required ones fail with a named file, optional
ones return None."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from epycd.errors import InputError

T = TypeVar("T")

ROOT_FIX = "point --root (EPYCD_HOST_ROOT) at a host root holding proc/ and sys/"
SYSTEMD_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
"""The PATH systemd gives a service, whose folders are looked up under the root: where
torch's inductor looks for g++ when vLLM starts (`detect.find_cxx`), and where
`#!/usr/bin/env python3` finds its interpreter (`pyheaders`)."""


def read_required(root: Path, relative: str) -> str:
    path = root / relative
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InputError("missing", file=path, fix=ROOT_FIX) from None
    except OSError as exc:
        raise InputError(f"unreadable: {exc.strerror}", file=path, fix=ROOT_FIX) from None


def read_optional(root: Path, relative: str) -> str | None:
    """Plain `open` on a joined string: detection reads thousands of small sysfs files."""
    try:
        with open(os.path.join(root, relative), encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return None


def parsed(root: Path, relative: str, text: str, parse: Callable[[str], T]) -> T:
    """`parse(text)`, with a parse failure reported as bad input naming the file."""
    try:
        return parse(text)
    except ValueError as exc:
        raise InputError(f"cannot parse: {exc}", file=root / relative) from None
