"""Least privilege: what an endpoint's unit lets its processes do (systemd.exec(5)).

A host endpoint runs vLLM, a large Python stack serving the network, on the operator's model
files. Its unit runs it as the product's own system user (`PRODUCT_USER`, made by
packaging/epyc-llm.sysusers.conf), with a read-only system, its own state, cache and runtime
folders, no capabilities and the sandbox below; `systemd-analyze security --offline=yes`
rates it under 4.5 (tests/render/test_security.py). The docker path's `.service` runs only
the docker client and the supervisor: it stays root (the docker socket is root's) but gets
the same sandbox otherwise; the container itself drops every capability but SYS_NICE.

`HOST_LEFT_OUT`, `DOCKER_LEFT_OUT` and `QUADLET_LEFT_OUT` say, for each hardening directive
a unit does not carry, why: that is the record an admin (and a reviewer) reads. Their keys
are the names `systemd-analyze security` gives its checks; tests/render/test_security.py
holds every check a unit fails to a reason here.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from epycd.engines import engine_named
from epycd.errors import InputError
from epycd.listen import is_loopback
from epycd.plan.model import AnyServer
from epycd.plan.service.hfcache import ENDPOINT_HF_HOME
from epycd.render.syntax import check_printable, escape_specifiers, quote_word
from epycd.render.text import Line

PRODUCT_USER = "epyc-llm"
"""The endpoints' system user and group (packaging/epyc-llm.sysusers.conf)."""
RUN_ROOT = PurePosixPath("/run")
HF_CACHE_DIRECTORY = ENDPOINT_HF_HOME.removeprefix("/var/cache/")
"""CacheDirectory= of the host endpoints' shared HF cache."""

ALLOWED_FAMILIES = "AF_UNIX AF_INET AF_INET6 AF_NETLINK"
NETLINK_REASON = (
    "torch.distributed's gloo group (vLLM's CPU worker, even with one rank) looks up the "
    "interfaces with getifaddrs(3), which asks the kernel over netlink"
)

COMMON_SANDBOX: tuple[Line, ...] = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("PrivateIPC", "yes"),
    ("PrivateMounts", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("RestrictAddressFamilies", ALLOWED_FAMILIES),
    ("SystemCallArchitectures", "native"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged"),
    ("SystemCallErrorNumber", "EPERM"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("UMask", "0077"),
)
"""@system-service keeps what NUMA binding needs (@resources: set_mempolicy, mbind,
sched_setaffinity, migrate_pages) and what the compile step runs (g++, ld: @process,
@file-system); @privileged is what no unprivileged process may do anyway."""

SERVES = "the endpoint serves HTTP on the host's network, and the health gate connects to it"
HOST_LEFT_OUT: dict[str, str] = {
    "MemoryDenyWriteExecute=": "oneDNN and zentorch generate their CPU kernels at run time "
    "(Xbyak JIT: memory mapped writable, then executable), which the filter forbids",
    "PrivateNetwork=": SERVES,
    "RestrictAddressFamilies=~AF_(INET|INET6)": SERVES,
    "IPAddressDeny=": "set (loopback only) when the endpoint listens on loopback and never "
    "downloads; one listening beyond loopback answers any client, and one that may download "
    "from the Hub must reach it",
    "RestrictAddressFamilies=~AF_UNIX": "sd_notify (READY=1, WATCHDOG=1) and vLLM's ZeroMQ "
    "channels between its API server and engine core are unix sockets",
    "RestrictAddressFamilies=~AF_NETLINK": NETLINK_REASON,
    "PrivateUsers=": "a user namespace hides the host's users and groups: the model folders' "
    "group rights (group epyc-llm) would no longer apply",
    "DynamicUser=": "a fixed user (sysusers.d) keeps the caches' owner across restarts and lets "
    "an admin give model folders to the group epyc-llm",
    "ProcSubset=": "vLLM and torch read /proc/cpuinfo and /proc/meminfo to size themselves",
    "SystemCallFilter=~@resources": "NUMA binding and pinning are @resources calls "
    "(set_mempolicy, mbind, migrate_pages, sched_setaffinity)",
    "RootDirectory=/RootImage=": "vLLM runs from its environment on the host's filesystem; "
    "ProtectSystem=strict makes that read-only instead",
    "DeviceAllow=": "no device is open to the endpoint; the one systemd lists is the clock "
    "(char-rtc, read-only), which ProtectClock= itself allows",
}
DOCKER_LEFT_OUT: dict[str, str] = {
    **{key: HOST_LEFT_OUT[key] for key in ("PrivateNetwork=", "RootDirectory=/RootImage=")},
    "IPAddressDeny=": HOST_LEFT_OUT["IPAddressDeny="],
    "RestrictAddressFamilies=~AF_(INET|INET6)": "the supervisor's health gate reaches vLLM "
    "over the host's network",
    "RestrictAddressFamilies=~AF_UNIX": "the docker socket and sd_notify are unix sockets",
    "RestrictAddressFamilies=~AF_NETLINK": "the docker client (Go) lists the interfaces",
    "User=/DynamicUser=": "the docker socket is root's: the client runs as root, without "
    "capabilities",
    "ProtectHome=": "read-only, not hidden: the docker client reads root's "
    "~/.docker/config.json (registry credentials) when `docker run` pulls the image",
    "PrivateUsers=": "the docker socket accepts root only; a user namespace would map it away",
    "ProcSubset=": "the supervisor and the docker client read /proc/meminfo and cpuinfo",
    "SystemCallFilter=~@resources": "the Go runtime of the docker client raises its open-files "
    "limit (setrlimit, an @resources call) at start",
    "DeviceAllow=": HOST_LEFT_OUT["DeviceAllow="],
}
QUADLET_LEFT_OUT: dict[str, str] = {
    "[Service] sandbox": "the unit's main process is podman itself, which needs root, "
    "mounts, namespaces and capabilities to start the container; the container is confined "
    "instead (DropCapability=all, AddCapability=SYS_NICE, NoNewPrivileges=true)",
    "ReadOnly": "vLLM, torch's inductor and Triton write caches under the image's home and "
    "/tmp; images differ in where, so the root filesystem stays writable",
    "User (in the container)": "the vLLM images run as root and keep their caches under "
    "/root; the HF cache is mounted at /root/.cache/huggingface",
}


HOST_ONLY: tuple[Line, ...] = (("RemoveIPC", "yes"), ("ProtectHome", "yes"))
"""With paths to read under a home (`home_lines`), ProtectHome=tmpfs replaces "yes"."""
DOCKER_ONLY: tuple[Line, ...] = (("ProtectHome", "read-only"), ("MemoryDenyWriteExecute", "yes"))
STATIC_DIRECTIVES: tuple[Line, ...] = (*COMMON_SANDBOX, *HOST_ONLY, *DOCKER_ONLY)
"""Every sandbox line that does not depend on the endpoint."""


def _path_word(path: str, what: str) -> str:
    check_printable(path, what)
    if not path.startswith("/"):
        raise InputError(
            f"{what} must be an absolute path: {path!r}", key=what, fix="plan the endpoint again"
        )
    return quote_word(escape_specifiers(os.path.normpath(path)))


def endpoint_folders(decisions: AnyServer) -> tuple[str, str]:
    """The endpoint's state and cache folders, relative to /var/lib and /var/cache."""
    return (f"epyc-llm/endpoints/{decisions.endpoint}", f"epyc-llm/endpoints/{decisions.endpoint}")


def status_lines(decisions: AnyServer) -> list[Line]:
    """The supervisor's status folder, writable by it and kept after a stop for `status`:
    the endpoint's own folder under /run is its RuntimeDirectory= (epycd.paths
    .endpoint_status_file); another (a moved EPYCD_RUN_DIR) is a ReadWritePaths=."""
    if not decisions.status_file:
        return []
    folder = PurePosixPath(os.path.normpath(decisions.status_file)).parent
    if folder.is_relative_to(RUN_ROOT) and folder.name == decisions.endpoint:
        relative = str(folder.relative_to(RUN_ROOT))
        return [
            ("RuntimeDirectory", _path_word("/" + relative, "status_file")[1:]),
            ("RuntimeDirectoryPreserve", "yes"),
        ]
    return [("ReadWritePaths", "-" + _path_word(str(folder), "status_file"))]


CACHE_VARIABLES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def hf_home(decisions: AnyServer) -> str | None:
    """HF_HOME of a host endpoint: the plan's variable, else the resolved cache."""
    if "HF_HOME" in decisions.env:
        return decisions.env["HF_HOME"]
    return decisions.hf_cache.host_path if decisions.hf_cache else None


def host_folders(decisions: AnyServer) -> list[Line]:
    """State, caches and status where the endpoint's user may write; everything else is
    read-only (ProtectSystem=strict)."""
    state, cache = endpoint_folders(decisions)
    caches = [cache]
    hf = hf_home(decisions)
    if hf == ENDPOINT_HF_HOME:
        caches.append(HF_CACHE_DIRECTORY)
    lines: list[Line] = [
        ("StateDirectory", state),
        ("CacheDirectory", " ".join(caches)),
        ("WorkingDirectory", f"%S/{state}"),
    ]
    writable = [hf] if hf and HF_CACHE_DIRECTORY not in caches else []
    writable += [decisions.env[name] for name in CACHE_VARIABLES if name in decisions.env]
    lines += [("ReadWritePaths", "-" + _path_word(path, "env")) for path in writable]
    return lines + status_lines(decisions)


def cache_environment(decisions: AnyServer) -> list[str]:
    """HOME and the caches of what the server compiles (its engine's `cache_variables`:
    vLLM's, inductor's and Triton's; none for llama-server) in the endpoint's own folders,
    unless the endpoint file moved them."""
    state, cache = endpoint_folders(decisions)
    defaults = {"HOME": f"%S/{state}"} | {
        name: f"%C/{cache}/{folder}"
        for name, folder in engine_named(decisions.engine).cache_variables
    }
    return [f"{name}={value}" for name, value in defaults.items() if name not in decisions.env]


def ip_lines(decisions: AnyServer) -> list[Line]:
    """Loopback only, when the endpoint listens on loopback and never downloads (a local
    model folder, or HF_HUB_OFFLINE=1)."""
    offline = decisions.model.startswith("/") or decisions.env.get("HF_HUB_OFFLINE") == "1"
    if not offline or not is_loopback(decisions.host):
        return []
    return [("IPAddressAllow", "localhost"), ("IPAddressDeny", "any")]


def home_lines(decisions: AnyServer) -> list[Line]:
    """The homes hidden, or (when the plan must read inside them: a pyenv interpreter, a
    model in ~) an empty tmpfs over them with exactly those paths bound back read-only."""
    if not decisions.home_read_paths:
        return [("ProtectHome", "yes")]
    return [("ProtectHome", "tmpfs")] + [
        ("BindReadOnlyPaths", _path_word(path, "home_read_paths"))
        for path in decisions.home_read_paths
    ]


def host_sandbox(decisions: AnyServer) -> list[Line]:
    return [
        ("User", PRODUCT_USER),
        ("Group", PRODUCT_USER),
        ("RemoveIPC", "yes"),
        *home_lines(decisions),
        *COMMON_SANDBOX,
        *ip_lines(decisions),
    ]


def docker_sandbox(decisions: AnyServer) -> list[Line]:
    """The docker client and the supervisor: root for the socket, nothing else."""
    return [
        *DOCKER_ONLY,
        *COMMON_SANDBOX,
        *ip_lines(decisions),
        *status_lines(decisions),
    ]
