"""Write models into a real Hugging Face hub cache layout (what `hf download` leaves behind).

HF_HOME/hub/models--ORG--NAME/
    refs/main                   the commit hash
    blobs/<git sha1 or sha256>  file contents
    snapshots/<commit>/<file>   relative symlinks to ../../blobs/<hash>
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def commit_for(repo_id: str) -> str:
    """A stable 40-hex commit id per repo (the real ones are not needed offline)."""
    return hashlib.sha1(f"commit {repo_id}".encode()).hexdigest()


def repo_folder(hub_cache: Path, repo_id: str) -> Path:
    return hub_cache / ("models--" + repo_id.replace("/", "--"))


def add_to_cache(
    hub_cache: Path,
    repo_id: str,
    files: dict[str, bytes | Path],
    *,
    commit: str | None = None,
    ref: str = "main",
) -> Path:
    """Put files in the cache as a snapshot of `commit`; a Path is moved in as an LFS blob."""
    commit = commit or commit_for(repo_id)
    repo = repo_folder(hub_cache, repo_id)
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, Path):
            digest = hashlib.sha256(content.read_bytes()).hexdigest()
            blob = repo / "blobs" / digest
            content.replace(blob)
        else:
            blob = repo / "blobs" / git_blob_sha1(content)
            blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs" / ref).write_text(commit)
    return snapshot
