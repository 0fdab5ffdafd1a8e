"""What an endpoint may be called, and what its units are called: the one definition that the
endpoint files, the planner, the renderer, the approval records, status and the port
owner lookup share.

An endpoint name is the stem of its endpoint file: lowercase letters, digits and '-', at most
63, not starting with '-'. It becomes part of a unit name, a file name under the state and
run folders, and a cgroup path, so it holds nothing systemd, a shell or a path would read
specially ('.', '@', '\\', '/', upper case that differs only in case).
"""

from __future__ import annotations

import re

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


def is_endpoint_name(name: str) -> bool:
    return ENDPOINT_NAME.fullmatch(name) is not None


def unit_name(endpoint: str) -> str:
    """The unit stem of an endpoint: `epyc-llm-NAME` (NAME.service, or NAME.container)."""
    return f"{UNIT_PREFIX}{endpoint}"


def instance_unit_name(endpoint: str, instance: int) -> str:
    """The unit stem of instance N of a multi-instance endpoint: `epyc-llm-NAME_N`."""
    return f"{unit_name(endpoint)}{INSTANCE_SEPARATOR}{instance}"
