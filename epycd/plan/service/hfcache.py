"""The Hugging Face cache the container mounts: `HF_HOME` (else root's
`~/.cache/huggingface`), symlinks resolved, NFS flagged.

A bind mount of a symlink or of an NFS home with root-squash fails at container start; the
resolved real path is what gets mounted, and an NFS cache gets a warning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from epycd.plan.model import HfCacheMount
from epycd.plan.service.homes import in_a_home
from epycd.readfile import PROC_MAX_BYTES, read_text

ROOT_HF_HOME = Path("/root/.cache/huggingface")
ENDPOINT_HF_HOME = "/var/cache/epyc-llm/huggingface"
"""The host endpoints' own HF cache (their unit's CacheDirectory=epyc-llm/huggingface)."""
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs"})


def hf_home(environ: Mapping[str, str]) -> Path:
    """The services run as root: HF_HOME when set, else root's default cache."""
    value = environ.get("HF_HOME")
    return Path(value) if value else ROOT_HF_HOME


def _unescape_mount_field(field: str) -> str:
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")).replace(
        "\\134", "\\"
    )


def mount_fstype(path: Path, mounts_text: str) -> str | None:
    """The filesystem type of the longest mount point containing `path` (proc/mounts)."""
    best: tuple[int, str] | None = None
    text = str(path)
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount_field(fields[1])
        inside = text == point or text.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), fields[2])
    return best[1] if best else None


def resolve_hf_cache(host_root: Path, environ: Mapping[str, str]) -> HfCacheMount:
    """The cache folder as the host sees it (links followed), and whether it is on NFS."""
    home = hf_home(environ)
    real = Path(os.path.realpath(home))
    try:
        mounts = read_text(host_root / "proc" / "mounts", PROC_MAX_BYTES, errors="replace")
    except OSError:
        mounts = ""
    fstype = mount_fstype(real, mounts)
    return HfCacheMount(
        host_path=str(real), on_nfs=fstype is not None and fstype in NETWORK_FILESYSTEMS
    )


def host_hf_home(hf: HfCacheMount) -> str:
    """HF_HOME for a host endpoint, which runs as the user epyc-llm under ProtectHome=yes:
    a cache under /root or /home is out of its reach, so it gets its own."""
    return ENDPOINT_HF_HOME if in_a_home(hf.host_path) else hf.host_path
