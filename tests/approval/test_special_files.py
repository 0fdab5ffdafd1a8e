"""Special files in the state folder: an approval record, an install journal, a stop marker or a
supervisor status file that is a FIFO, a device, a symlink to one, a folder or over its size cap
affects only its own endpoint. `status`, the boot check of the other endpoint and the daemon
return at once (a FIFO read would block them forever), without a traceback; a record that is a
folder is repaired by `approve NAME` and `remove NAME`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.approval.record import approval_path, load_approval
from epycd.paths import endpoint_status_file
from epycd.readfile import RECORD_MAX_BYTES, STATE_MAX_BYTES
from tests.approval.conftest import ApprovalSandbox
from tests.approval.isolation import (
    approve_two,
    assert_clean,
    boot_check,
    daemon_status,
    status_rows,
)
from tests.sandbox import run_python

COMMAND_SECONDS = 30
"""A command here returns in a second or two; a blocked read never does."""


def make_fifo(path: Path, _cap: int) -> None:
    os.mkfifo(path)


def make_zero_link(path: Path, _cap: int) -> None:
    path.symlink_to("/dev/zero")


def make_null_device(path: Path, _cap: int) -> None:
    os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's


def make_folder(path: Path, _cap: int) -> None:
    path.mkdir()
    (path / "inside").write_text("x")


def make_huge(path: Path, cap: int) -> None:
    with path.open("wb") as file:
        file.truncate(cap + 1)  # sparse: over the cap without taking the disk


SPECIAL: dict[str, Callable[[Path, int], None]] = {
    "fifo": make_fifo,
    "symlink-to-dev-zero": make_zero_link,
    "char-device": make_null_device,
    "folder": make_folder,
    "over-the-cap": make_huge,
}


def replace_with(path: Path, kind: str, cap: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    SPECIAL[kind](path, cap)


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_approval_record_affects_only_its_endpoint(
    env: ApprovalSandbox, kind: str
) -> None:
    approve_two(env)
    before = status_rows(env)
    record = approval_path(env.settings, "beta")
    replace_with(record, kind, RECORD_MAX_BYTES)

    after = status_rows(env)
    assert after["alpha"] == before["alpha"]
    assert after["beta"]["state"] == "damaged"
    assert str(record) in after["beta"]["reason"]
    assert boot_check(env, "alpha").returncode == 0
    refused = boot_check(env, "beta")
    assert refused.returncode == 2 and str(record) in refused.stderr
    by_daemon = daemon_status(env)
    assert by_daemon["alpha"]["state"] == before["alpha"]["state"]
    assert by_daemon["beta"]["state"] == "damaged"


@pytest.mark.parametrize("command", ["approve", "remove"])
def test_a_record_that_is_a_folder_is_repaired_by_approve_and_remove(
    env: ApprovalSandbox, command: str
) -> None:
    """The damaged record's message promises `epycctl approve NAME` replaces it and
    `epycctl remove NAME` deletes it; a folder in its place is no exception."""
    approve_two(env)
    before = status_rows(env)
    record = approval_path(env.settings, "beta")
    replace_with(record, "folder", RECORD_MAX_BYTES)
    reason = status_rows(env)["beta"]["reason"]
    assert f"`epycctl {command} beta`" in reason

    args = ("--yes", "--no-start") if command == "approve" else ("--yes", "--no-stop")
    done = env.epycctl(command, "beta", *args)
    assert_clean(done, 0)
    if command == "approve":
        assert record.is_file() and load_approval(env.settings, "beta") is not None
    else:
        assert not record.exists()
        assert not (env.settings.unit_dir / "epyc-llm-beta.service").exists()
    assert status_rows(env)["alpha"] == before["alpha"]


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_journal_is_dropped_and_the_others_carry_on(
    env: ApprovalSandbox, kind: str
) -> None:
    approve_two(env)
    before = status_rows(env)
    journal = env.settings.state_dir / "transactions" / "beta.json"
    replace_with(journal, kind, RECORD_MAX_BYTES)

    assert status_rows(env)["alpha"] == before["alpha"]
    assert boot_check(env, "alpha").returncode == 0
    again = env.epycctl("approve", "alpha", "--yes", "--no-start")
    assert_clean(again, 0)
    assert f"dropped an unreadable transaction journal {journal}" in again.stdout
    assert not journal.exists() and not journal.is_symlink()
    assert load_approval(env.settings, "beta") is not None


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_stop_marker_keeps_its_endpoint_down_and_the_other_up(
    env: ApprovalSandbox, kind: str
) -> None:
    approve_two(env)
    before = status_rows(env)
    marker = env.settings.state_dir / "stopped" / "beta.json"
    replace_with(marker, kind, STATE_MAX_BYTES)

    after = status_rows(env)
    assert after["alpha"] == before["alpha"]
    assert after["beta"]["stopped_by"].startswith("unknown (unreadable marker")
    assert boot_check(env, "alpha").returncode == 0
    assert boot_check(env, "beta").returncode == 1
    assert daemon_status(env)["alpha"]["state"] == before["alpha"]["state"]


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_supervisor_status_file_is_no_status(env: ApprovalSandbox, kind: str) -> None:
    approve_two(env)
    before = status_rows(env)
    status_file = endpoint_status_file(env.settings.run_dir, "beta")
    replace_with(status_file, kind, STATE_MAX_BYTES)

    after = status_rows(env)
    assert after == before
    assert daemon_status(env)["alpha"]["state"] == before["alpha"]["state"]


CONF_KINDS = ("fifo", "symlink-to-dev-zero", "folder", "over-the-cap")
COMMANDS = (("status",), ("plan", "alpha"), ("approve", "alpha", "--yes"), ("detect",),
            ("stop", "alpha"), ("remove", "alpha", "--yes"))  # fmt: skip


@pytest.mark.parametrize("kind", CONF_KINDS)
def test_an_epycd_conf_that_is_not_a_file_is_bad_input_for_every_command(
    env: ApprovalSandbox, kind: str
) -> None:
    """It was ignored (a folder, a FIFO) or hung every command (a FIFO read): bad input,
    exit 2, naming the file and what it is, at once and without a traceback."""
    conf = env.settings.config_dir / "epycd.conf"
    replace_with(conf, kind, STATE_MAX_BYTES)
    for command in COMMANDS:
        done = run_python(["-m", "epycd", *command], env=env.environ(), timeout=COMMAND_SECONDS)
        assert_clean(done, 2)
        assert str(conf) in done.stderr, (command, done.stderr)
    said = {"fifo": "FIFO", "symlink-to-dev-zero": "character device", "folder": "folder",
            "over-the-cap": "larger than 1 MiB"}[kind]  # fmt: skip
    assert said in done.stderr
