"""Durable file writes: a temporary file in the target's own folder, fsync, rename, fsync
the folder. A reader sees the old file or the new one, never a partial one.

Modes are set explicitly, whatever the umask of the admin's shell: a folder created with
umask 077 would hide every approval from the users `epycctl status` is for."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

STAGED_SUFFIX = ".epycd-staged"


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staged_path(target: Path, tag: str) -> Path:
    """The temporary name next to `target`; hidden, so no tool loads it as a unit."""
    return target.with_name(f".{target.name}.{tag}{STAGED_SUFFIX}")


_STAGED_NAME = re.compile(rf"\.(?P<target>.+)\.[^.]+{re.escape(STAGED_SUFFIX)}")


def target_of(path: Path) -> Path:
    """The file a staged file stands for (`.x.service.new.epycd-staged` -> `x.service`);
    any other path as it is. Errors name the file the person knows, not a hidden one."""
    match = _STAGED_NAME.fullmatch(path.name)
    return path.with_name(match["target"]) if match else path


def named_for_target(exc: OSError) -> OSError:
    """`exc` naming the staged file's target instead of the staged file."""
    if isinstance(exc.filename, str) and exc.filename.endswith(STAGED_SUFFIX):
        return type(exc)(exc.errno, exc.strerror, str(target_of(Path(exc.filename))))
    return exc


def make_dirs(folder: Path, mode: int = 0o755) -> None:
    """`mkdir -p folder` with `mode` on every folder it creates (not on existing ones)."""
    missing = []
    current = folder
    while not current.exists():
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            continue
        os.chmod(path, mode)


def write_durable(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` (which must not be in use by anyone) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    finally:
        os.close(fd)


def replace_durable(staged: Path, target: Path) -> None:
    os.replace(staged, target)
    fsync_dir(target.parent)


def write_atomic(target: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `target` with `data` or leave it as it was: on a failure (a full disk, no
    permission) the staged file is deleted and the error names `target`."""
    make_dirs(target.parent)
    staged = staged_path(target, f"{os.getpid()}")
    try:
        write_durable(staged, data, mode)
        replace_durable(staged, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
        raise named_for_target(exc) from None


def unlink_durable(target: Path) -> None:
    try:
        target.unlink()
    except FileNotFoundError:
        return
    fsync_dir(target.parent)


def remove_durable(target: Path) -> None:
    """`unlink_durable`, and a folder (not a symlink to one) where a file of the product's
    own belongs (an approval record, a journal) removed with what it holds."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
        fsync_dir(target.parent)
        return
    unlink_durable(target)
