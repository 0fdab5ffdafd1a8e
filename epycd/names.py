"""What an endpoint may be called, and what its units are called: the one definition that the
endpoint files, the planner, the renderer, the approval records, status and the port
owner lookup share.

An endpoint name is the stem of its endpoint file: lowercase letters, digits and '-', at most
63, not starting with '-'. It becomes part of a unit name, a file name under the state and
run folders, and a cgroup path, so it holds nothing systemd, a shell or a path would read
specially ('.', '@', '\\', '/', upper case that differs only in case).

A model's `revision` and a repository's `gguf_file` become paths in the HF cache
(`refs/REVISION`, `snapshots/COMMIT/FILE`): `revision_problem` and `repo_file_problem` say why
one is not a name the hub would take, before huggingface_hub joins it to a folder.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath

UNIT_PREFIX = "epyc-llm-"
ENDPOINT_NAME_RULE = r"[a-z0-9][a-z0-9-]{0,62}"
ENDPOINT_NAME = re.compile(ENDPOINT_NAME_RULE)
INSTANCE_SEPARATOR = "_"
"""Between an endpoint's unit stem and an instance number: never in an endpoint name, so
`epyc-llm-NAME_2` is no other endpoint's unit."""
ENDPOINT_NAME_FIX = "lowercase letters, digits and '-', at most 63, not starting with '-'"
UNIT_IN_CGROUP = re.compile(
    rf"{re.escape(UNIT_PREFIX)}({ENDPOINT_NAME_RULE})(?:{INSTANCE_SEPARATOR}[0-9]+)?\.service"
)
"""An endpoint's main service, or one of its instances, in a cgroup path; the group is the
endpoint's name."""


MODEL_NAME_RULE = r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}"
MODEL_NAME = re.compile(MODEL_NAME_RULE)
"""A model name the gateway routes, and an alias's: it is a key of HAProxy's maps, whose lines
split at white space, and it is written into logs; so no space, quote, '#' or control
character."""
MODEL_NAME_FIX = "letters, digits and _ . : / @ + -, at most 200, starting with a letter or digit"


RESERVED_NAMES = {"gateway": "the gateway's unit is epyc-llm-gateway.service (docs/gateway.md)"}
"""Names an endpoint may not take: its units would be another part's."""


def is_endpoint_name(name: str) -> bool:
    return ENDPOINT_NAME.fullmatch(name) is not None


def unit_name(endpoint: str) -> str:
    """The unit stem of an endpoint: `epyc-llm-NAME` (NAME.service, or NAME.container)."""
    return f"{UNIT_PREFIX}{endpoint}"


def instance_unit_name(endpoint: str, instance: int) -> str:
    """The unit stem of instance N of a multi-instance endpoint: `epyc-llm-NAME_N`."""
    return f"{unit_name(endpoint)}{INSTANCE_SEPARATOR}{instance}"


REVISION_CHARS = re.compile(r"[A-Za-z0-9._/-]{1,200}")
REVISION_FIX = (
    "give a branch or tag (names of letters, digits, '.', '_' and '-' joined by single '/', "
    "e.g. main, v1.0, refs/pr/1) or a commit's 40 hex digits"
)


def revision_problem(revision: str) -> str | None:
    """Why `revision` is no branch, tag or commit, or None. git's rules for a ref name (git
    check-ref-format), which the hub's branches and tags follow, on the characters a
    revision may have: so that `refs/REVISION` in the HF cache is a file under `refs/`, never
    another file read as a commit."""
    if not REVISION_CHARS.fullmatch(revision):
        return "has a character no branch, tag or commit has, or more than 200"
    parts = revision.split("/")
    if revision.startswith("/"):
        return "is an absolute path"
    if ".." in revision:
        return "contains '..'"
    if "" in parts:
        return "has an empty part (a '/' at its end or doubled)"
    if any(part.startswith(".") or part.endswith((".lock", ".")) for part in parts):
        return "has a part that starts with '.' or ends with '.' or '.lock'"
    return None


def repo_file_problem(name: str) -> str | None:
    """Why `name` is no file of a repository, or None: huggingface_hub's own rule for a
    repository's file name (no '..' part, '/' or '\\' separated; not absolute, drive-relative
    or UNC by POSIX or Windows rules), and no empty part, so that `snapshots/COMMIT/NAME` (or
    a model folder's NAME) stays inside its folder."""
    if ".." in name.replace("\\", "/").split("/"):
        return "has a '..' part: it leaves the repository or folder"
    pure = [PurePosixPath(name), *(PureWindowsPath(part) for part in name.split("/"))]
    if any(path.drive or path.root for path in pure):
        return "is an absolute or drive path: give the file's name inside the repository or folder"
    if "" in name.split("/") or "." in name.split("/"):
        return "has an empty or '.' part"
    return None
