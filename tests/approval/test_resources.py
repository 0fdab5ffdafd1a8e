"""A full disk, a read-only folder: approve, stop and remove end with the file named and the
fix (exit 1), and leave nothing half-done: no staged file, no approval without its units,
no stop marker cut short. Real file systems: a tiny tmpfs filled up, a read-only bind
mount (both need root; unmounted in teardown). And `--json` on approve, stop and remove."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.approval.record import load_approval
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def tiny_tmpfs(folder: Path) -> Iterator[None]:
    """`folder` on a 64 KiB tmpfs."""
    mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder))
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)


def fill(folder: Path) -> None:
    """Take every free block of `folder`'s file system."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 512)
    finally:
        os.close(fd)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    mount("--bind", str(folder), str(folder))
    try:
        mount("-o", "remount,bind,ro", str(folder))
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, timeout=30)


def leftovers(*folders: Path) -> list[Path]:
    """Staged files and transaction journals anywhere under `folders`."""
    return [
        path
        for folder in folders
        for path in folder.rglob("*")
        if path.name.endswith(".epycd-staged") or path.parent.name == "transactions"
    ]


def approved(env: ApprovalSandbox) -> ApprovalSandbox:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    done = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stderr
    return env


def assert_clear_refusal(done: subprocess.CompletedProcess[str], file: Path, fix: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(file) in line and fix in line, line


@needs_root
def test_approve_on_a_full_state_disk_leaves_no_unit_and_no_approval(env: ApprovalSandbox) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    state = env.settings.state_dir
    with tiny_tmpfs(state):
        fill(state)
        done = env.epycctl("approve", "chat", "--yes", "--no-start")
        assert_clear_refusal(done, state / "approvals" / "chat.json", "free space on it")
        assert "No space left on device" in done.stderr
        assert load_approval(env.settings, "chat") is None
        assert list(env.settings.unit_dir.iterdir()) == []
        assert leftovers(state, env.settings.unit_dir) == []
        (state / "filler").unlink()
        assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0


@needs_root
def test_approve_into_a_read_only_unit_folder_changes_nothing(env: ApprovalSandbox) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    unit = env.settings.unit_dir / "epyc-llm-chat.service"
    with read_only(env.settings.unit_dir):
        done = env.epycctl("approve", "chat", "--yes", "--no-start")
        assert_clear_refusal(done, unit, "remount it read-write")
    assert not unit.exists() and load_approval(env.settings, "chat") is None
    assert leftovers(env.settings.state_dir, env.settings.unit_dir) == []


@needs_root
def test_remove_on_a_full_disk_keeps_the_endpoint_whole(env: ApprovalSandbox) -> None:
    state = env.settings.state_dir
    unit = env.settings.unit_dir / "epyc-llm-chat.service"
    with tiny_tmpfs(state):
        approved(env)
        before = unit.read_text()
        fill(state)
        done = env.epycctl("remove", "chat", "--yes", "--no-stop")
        assert_clear_refusal(done, state / "transactions" / "chat.json", "free space on it")
        assert unit.read_text() == before
        assert load_approval(env.settings, "chat") is not None
        assert leftovers(state, env.settings.unit_dir) == []


@needs_root
def test_stop_on_a_full_disk_writes_no_partial_marker(env: ApprovalSandbox) -> None:
    approved(env)
    env.install_fake_systemctl()
    stopped = env.settings.state_dir / "stopped"
    stopped.mkdir()
    with tiny_tmpfs(stopped):
        fill(stopped)
        done = env.epycctl("stop", "chat")
        assert_clear_refusal(done, stopped / "chat.json", "free space on it")
        assert sorted(p.name for p in stopped.iterdir()) == ["filler"]
    assert env.systemctl_calls() == []


def test_approve_stop_remove_answer_in_json(env: ApprovalSandbox) -> None:
    env.install_fake_systemctl()
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    done = env.epycctl("approve", "chat", "--yes", "--no-start", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    unit = str(env.settings.unit_dir / "epyc-llm-chat.service")
    assert (answer["endpoint"], answer["action"], answer["result"]) == (
        "chat",
        "approve",
        "approved",
    )
    assert answer["units"] == [unit] and len(answer["fingerprint"]) == 64

    stop = env.epycctl("stop", "chat", "--json", FAKE_ACTIVE="active", FAKE_ENABLED="enabled")
    assert stop.returncode == 0, stop.stderr
    answer = json.loads(stop.stdout)
    assert (answer["endpoint"], answer["action"], answer["result"]) == ("chat", "stop", "stopped")
    assert "systemctl stop epyc-llm-chat.service" in answer["steps"]

    for argv in (["approve", "nosuch", "--yes"], ["stop", "nosuch"], ["remove", "nosuch", "--yes"]):
        failed = env.epycctl(*argv, "--json")
        assert failed.returncode == 2, failed.stderr
        answer = json.loads(failed.stdout)
        assert (answer["endpoint"], answer["action"]) == ("nosuch", argv[0])
        assert answer["result"] == "error" and "nosuch" in answer["error"]
        assert answer["exit_code"] == 2
