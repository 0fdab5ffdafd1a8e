"""File modes: journals are root's only; units and records stay world-readable (systemd
publishes unit settings to every user anyway, and status is for everyone), whatever the
umask of the admin's shell."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.plans import make_plan
from tests.approval.test_permissions import as_nobody

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="switching to another user needs root (CI runs as root)"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    """Folders another user can reach, the EPYCD_* ones not yet created (as on a new host)."""
    base = Path(tempfile.mkdtemp(prefix="epycd-mode-"))
    base.chmod(0o755)
    try:
        env = make_env(base, monkeypatch)
        for folder in ("state_dir", "unit_dir"):
            (base / folder).rmdir()
        yield env
    finally:
        shutil.rmtree(base)


def approve_with_umask(
    env: ApprovalSandbox, umask: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """`epycctl approve chat --yes --no-start` under this umask (an octal string)."""
    return env.epycctl("approve", "chat", "--yes", "--no-start", umask=int(umask, 8), env=extra)


def test_a_strict_umask_does_not_hide_the_approvals_from_users(open_env: ApprovalSandbox) -> None:
    env = open_env
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    done = approve_with_umask(env, "077")
    assert done.returncode == 0, done.stderr
    settings = env.settings
    for folder in (settings.state_dir, settings.state_dir / "approvals", settings.unit_dir):
        assert mode(folder) == 0o755, folder
    assert mode(settings.state_dir / "approvals" / "chat.json") == 0o644
    assert mode(settings.unit_dir / "epyc-llm-chat.service") == 0o644

    read = as_nobody(
        env,
        [
            "-c",
            "from epycd.approval.record import load_approval; from epycd.settings import "
            "Settings; print(load_approval(Settings(), 'chat').fingerprint)",
        ],
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == env.plans["chat"].fingerprint


def test_a_journal_is_readable_by_root_only(open_env: ApprovalSandbox) -> None:
    env = open_env
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    killed = approve_with_umask(env, "022", EPYCD_TEST_CRASH_AT="journaled")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    journal = env.settings.state_dir / "transactions" / "chat.json"
    assert mode(journal) == 0o600
    assert mode(journal.parent) == 0o755
    listed = as_nobody(
        env,
        [
            "-c",
            "from epycd.approval.install import pending_transactions; "
            "from epycd.settings import Settings; print(pending_transactions(Settings()))",
        ],
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "['chat']"
