"""The renderer's last line of defence: decisions that must never become a unit.

The planner already enforces these rules; a unit is what actually runs, so the renderer
checks them again and refuses (InputError naming the endpoint file and the key) rather than
write a unit that breaks its server, leaks a secret or mis-pins the instance. Here are the
checks of every server, whatever its engine (its identity, healing, cores and nodes, secret
files, plain paths); each engine's renderer adds its own (vLLM's:
`epycd.engines.vllm.render.policy`).
"""

from __future__ import annotations

import re

from epycd.errors import InputError
from epycd.host.cpulist import parse_cpulist
from epycd.listen import listen_address
from epycd.names import ENDPOINT_NAME_RULE, instance_unit_name, is_endpoint_name, unit_name
from epycd.plan.model import AnyServer, CpuServer, EndpointService
from epycd.render.syntax import check_printable, executable

IMAGE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
PLAIN_PATH_FORBIDDEN = re.compile(r"[\s:$\\\"',]")


def refuse(decisions: EndpointService, key: str, message: str, fix: str) -> InputError:
    return InputError(message, file=decisions.config_file, key=key, fix=fix)


def check_identity(decisions: EndpointService) -> None:
    check_printable(decisions.model, "model")
    check_printable(decisions.served_model_name, "served_model_name")
    executable(decisions.product_python, "product_python")
    if decisions.vllm_executable is not None:
        executable(decisions.vllm_executable, "vllm")
    if not is_endpoint_name(decisions.endpoint):
        raise refuse(
            decisions,
            "endpoint",
            f"{decisions.endpoint!r} is not a valid endpoint name",
            f"name the file {ENDPOINT_NAME_RULE}.toml",
        )
    instance = decisions.instance
    expected = (
        unit_name(decisions.endpoint)
        if instance is None
        else instance_unit_name(decisions.endpoint, instance)
    )
    if decisions.unit_name != expected:
        raise refuse(
            decisions,
            "unit_name",
            f"unit name {decisions.unit_name!r} is not {expected}",
            "plan the endpoint again",
        )
    if not 1 <= decisions.port <= 65535:
        raise refuse(decisions, "port", f"port {decisions.port} is out of range", "use 1-65535")
    try:
        listen_address(decisions.host)
    except ValueError as error:
        raise refuse(decisions, "host", str(error), "use an IP address, e.g. 127.0.0.1") from None
    if decisions.start_timeout_s <= 0:
        raise refuse(
            decisions, "start_timeout_s", "the start timeout must be positive", "plan again"
        )
    check_healing(decisions)


def check_healing(decisions: EndpointService) -> None:
    """Every figure of `healing` positive (systemd reads 0 as "off" or refuses it), and no
    watchdog on podman, whose main process never pings one: systemd would kill a healthy
    container every `watchdog_s` (docs/healing.md)."""
    healing = decisions.healing
    if healing is None:
        return
    figures = healing.model_dump(exclude={"restart", "restart_clean_exit"})
    bad = sorted(name for name, value in figures.items() if value is not None and value <= 0)
    if bad:
        raise refuse(decisions, "healing", f"healing {', '.join(bad)} must be positive",
                      "plan again")  # fmt: skip
    if healing.watchdog_s is not None and decisions.runtime == "podman":
        raise refuse(
            decisions,
            "healing",
            "a podman unit cannot have a watchdog: podman never pings it",
            "plan again",
        )


def check_cpus_and_nodes(decisions: CpuServer) -> list[int]:
    """The pinned set, parsed; refused when it or the NUMA nodes are empty."""
    try:
        cpus = parse_cpulist(decisions.cpus)
    except ValueError:
        cpus = []
    if not cpus:
        raise refuse(
            decisions, "cpus", f"{decisions.cpus!r} is not a CPU list", "plan the endpoint again"
        )
    if not decisions.numa_nodes or min(decisions.numa_nodes) < 0:
        raise refuse(
            decisions,
            "numa_nodes",
            f"{decisions.numa_nodes} is not a list of NUMA nodes",
            "plan the endpoint again",
        )
    return cpus


def secret_files(decisions: AnyServer) -> list[tuple[str, str]]:
    """The secret files a unit loads as credentials or mounts: (key, path)."""
    files = [("hf_token_file", decisions.hf_token_file), ("api_key_file", decisions.api_key_file)]
    return [(key, path) for key, path in files if path]


def is_fully_qualified(image: str) -> bool:
    first, slash, _rest = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def check_plain_path(decisions: AnyServer, key: str, path: str) -> None:
    """A mounted or credential path: `-v`/`Volume=`/`LoadCredential=` split at `:` and `,`,
    and Quadlet copies `Volume=` into the unit without quoting."""
    bad = PLAIN_PATH_FORBIDDEN.search(path)
    if not path.startswith("/") or bad:
        found = f" (found {bad.group()!r})" if bad else ""
        raise refuse(
            decisions,
            key,
            f"{path!r} is not a plain absolute path{found}",
            "use an absolute path without whitespace, quotes, backslashes, ':', ',' or '$'",
        )
