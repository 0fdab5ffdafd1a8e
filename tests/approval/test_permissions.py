"""Only root or the admin group may approve or remove; anyone may read the state. Run as a
real non-root user (uid 65534 through setpriv), not by faking the uid."""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.approval.record import load_approval
from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.planned_epycctl import MODULE as PLANNED_EPYCCTL
from tests.approval.plans import make_plan
from tests.sandbox import run_python

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="switching to another user needs root (CI runs as root)"
)


def as_nobody(
    env: ApprovalSandbox,
    args: list[str],
    *,
    groups: list[int] | None = None,
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return run_python(args, env=env.environ() | (extra or {}), user=NOBODY, groups=groups or ())


@pytest.fixture
def open_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    """Folders another user can reach (pytest's own tmp folder is root-only)."""
    base = Path(tempfile.mkdtemp(prefix="epycd-perm-"))
    base.chmod(0o755)
    try:
        yield make_env(base, monkeypatch)
    finally:
        shutil.rmtree(base)


@pytest.fixture
def admin_group() -> Iterator[grp.struct_group]:
    name = f"epyct{uuid.uuid4().hex[:8]}"
    subprocess.run(["groupadd", name], check=True)
    try:
        yield grp.getgrnam(name)
    finally:
        subprocess.run(["groupdel", name], check=True)


def test_non_root_is_refused_but_can_read_the_state(open_env: ApprovalSandbox) -> None:
    env = open_env
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    service = env.settings.unit_dir / "epyc-llm-chat.service"

    for command in (["approve", "chat", "--yes", "--no-start"], ["remove", "chat", "--yes"]):
        done = as_nobody(env, ["-m", PLANNED_EPYCCTL, *command])
        assert done.returncode == 1, done.stderr
        assert f"{command[0]} needs root; you are nobody (uid {NOBODY})" in done.stderr
        assert "Traceback" not in done.stderr
    assert service.exists() and load_approval(env.settings, "chat") is not None

    read = as_nobody(
        env,
        [
            "-c",
            "import json,sys; from epycd.settings import Settings; "
            "from epycd.approval.state import endpoint_states; "
            "from epycd.plan.endpoint import Plan; "
            "d=json.load(open(sys.argv[1])); "
            "plans={n: Plan.model_validate(p) for n,p in d['plans'].items()}; "
            "print([s.state for s in endpoint_states(Settings(), plans)])",
            str(env.plan_file),
        ],
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "['approved']"


def name_admin_group(env: ApprovalSandbox, group: str) -> Path:
    """epycd.conf naming `group`, as root writes it: owned by root, mode 0644, in a folder
    owned by root that nobody else may write."""
    conf = env.settings.config_dir / "epycd.conf"
    conf.write_text(f'admin_group = "{group}"\n')
    for path in (conf, env.settings.config_dir):
        os.chown(path, 0, 0)
    conf.chmod(0o644)
    env.settings.config_dir.chmod(0o755)
    return conf


def test_admin_group_member_may_approve(
    open_env: ApprovalSandbox, admin_group: grp.struct_group
) -> None:
    env = open_env
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    for path in [env.tmp, *env.tmp.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    name_admin_group(env, admin_group.gr_name)
    extra = {"SUDO_USER": "mallory", "SUDO_UID": "0"}

    outsider = as_nobody(
        env, ["-m", PLANNED_EPYCCTL, "approve", "chat", "--yes", "--no-start"], extra=extra
    )
    assert outsider.returncode == 1
    assert f"needs root or a member of group {admin_group.gr_name!r}" in outsider.stderr

    member = as_nobody(
        env,
        ["-m", PLANNED_EPYCCTL, "approve", "chat", "--yes", "--no-start"],
        groups=[admin_group.gr_gid],
        extra=extra,
    )
    assert member.returncode == 0, member.stderr
    approval = load_approval(env.settings, "chat")
    assert approval is not None
    assert (approval.approver.uid, approval.approver.user) == (NOBODY, "nobody")
    assert approval.approver.sudo_user is None  # SUDO_* from a non-root process is not trusted
    assert (env.settings.unit_dir / "epyc-llm-chat.service").stat().st_uid == NOBODY


def test_admin_without_write_access_gets_a_clear_refusal(
    open_env: ApprovalSandbox, admin_group: grp.struct_group
) -> None:
    env = open_env
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    name_admin_group(env, admin_group.gr_name)
    done = as_nobody(
        env,
        ["-m", PLANNED_EPYCCTL, "approve", "chat", "--yes", "--no-start"],
        groups=[admin_group.gr_gid],
    )
    assert done.returncode == 1
    assert f"{env.settings.state_dir}/.lock: cannot write: Permission denied" in done.stderr
    assert "Traceback" not in done.stderr


APPROVE = ["-m", PLANNED_EPYCCTL, "approve", "chat", "--yes", "--no-start"]


def test_the_callers_environment_never_widens_who_may_approve(
    open_env: ApprovalSandbox, admin_group: grp.struct_group
) -> None:
    """A member of some group cannot make it the admin group: not through EPYCD_ADMIN_GROUP,
    not through an epycd.conf they wrote (EPYCD_CONFIG_DIR at their own folder), not
    through a root-owned one others may write."""
    env = open_env
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    for path in [env.tmp, *env.tmp.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    member = [admin_group.gr_gid]

    by_env = as_nobody(
        env, APPROVE, extra={"EPYCD_ADMIN_GROUP": admin_group.gr_name}, groups=member
    )
    assert by_env.returncode == 1, by_env.stdout + by_env.stderr
    assert "approve needs root; you are nobody" in by_env.stderr
    assert "EPYCD_ADMIN_GROUP" in by_env.stderr and "is ignored" in by_env.stderr

    conf = env.settings.config_dir / "epycd.conf"
    conf.write_text(f'admin_group = "{admin_group.gr_name}"\n')
    os.chown(conf, NOBODY, NOBODY)
    by_own_file = as_nobody(env, APPROVE, groups=member)
    assert by_own_file.returncode == 1
    assert "approve needs root; you are nobody" in by_own_file.stderr

    name_admin_group(env, admin_group.gr_name)
    conf.chmod(0o666)
    by_writable_file = as_nobody(env, APPROVE, groups=member)
    assert by_writable_file.returncode == 1
    assert "approve needs root; you are nobody" in by_writable_file.stderr

    assert not (env.settings.unit_dir / "epyc-llm-chat.service").exists()
    assert load_approval(env.settings, "chat") is None
    conf.chmod(0o644)
    trusted = as_nobody(env, APPROVE, groups=member)
    assert trusted.returncode == 0, trusted.stderr
