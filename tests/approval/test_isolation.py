"""One damaged file in the state folder, or an endpoint file with an odd name, affects only
its own endpoint: `status` of the others, the daemon and its status.json, the boot check of
the others, and `approve`/`remove` of the damaged one (which replace it) keep working."""

from __future__ import annotations

import re

import pytest

from epycd.approval.record import approval_path, load_approval
from tests.approval.conftest import ApprovalSandbox
from tests.approval.isolation import (
    approve_two,
    assert_clean,
    boot_check,
    daemon_status,
    run_product,
    status_rows,
)


def damaged_copies(good: bytes) -> dict[str, bytes]:
    """A state file damaged every way a crash, a disk or a careless edit can."""
    return {
        "empty": b"",
        "cut-short": good[: len(good) // 2],
        "wrong-shape": b'{"format": 1, "endpoint": "beta"}',
        "a-list": b"[1, 2, 3]",
        "not-utf8": b"\xff\xfe{\x00" + good[:20],
        # decisions no registered engine makes (an engine installed by its entry point, gone)
        "unknown-kind": re.sub(rb'"kind": ?"[^"]*"', b'"kind": "gone-engine"', good),
    }


DAMAGES = tuple(damaged_copies(b"{}"))


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_approval_record_affects_only_its_endpoint(
    env: ApprovalSandbox, damage: str
) -> None:
    approve_two(env)
    before = status_rows(env)
    record = approval_path(env.settings, "beta")
    record.write_bytes(damaged_copies(record.read_bytes())[damage])

    after = status_rows(env)
    assert after["alpha"] == before["alpha"]
    assert after["beta"]["state"] == "damaged"
    assert str(record) in after["beta"]["reason"]
    assert "`epycctl approve beta` replaces it" in after["beta"]["reason"]

    assert boot_check(env, "alpha").returncode == 0
    refused = boot_check(env, "beta")
    assert refused.returncode == 2 and str(record) in refused.stderr

    by_daemon = daemon_status(env)
    assert by_daemon["alpha"]["state"] == before["alpha"]["state"]
    assert by_daemon["beta"]["state"] == "damaged"

    replaced = env.epycctl("approve", "beta", "--yes", "--no-start")
    assert_clean(replaced, 0)
    assert load_approval(env.settings, "beta") is not None
    record.write_bytes(damaged_copies(record.read_bytes())[damage])
    removed = env.epycctl("remove", "beta", "--yes", "--no-stop")
    assert_clean(removed, 0)
    assert not record.exists()
    assert not (env.settings.unit_dir / "epyc-llm-beta.service").exists()
    assert status_rows(env)["alpha"] == before["alpha"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_journal_affects_only_its_endpoint(env: ApprovalSandbox, damage: str) -> None:
    approve_two(env)
    before = status_rows(env)
    journal = env.settings.state_dir / "transactions" / "beta.json"
    journal.parent.mkdir(exist_ok=True)
    journal.write_bytes(damaged_copies(approval_path(env.settings, "beta").read_bytes())[damage])

    assert status_rows(env)["alpha"] == before["alpha"]
    assert boot_check(env, "alpha").returncode == 0
    again = env.epycctl("approve", "alpha", "--yes", "--no-start")
    assert_clean(again, 0)
    assert f"dropped an unreadable transaction journal {journal}" in again.stdout
    assert not journal.exists()
    assert load_approval(env.settings, "beta") is not None


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_stop_marker_affects_only_its_endpoint(env: ApprovalSandbox, damage: str) -> None:
    approve_two(env)
    before = status_rows(env)
    marker = env.settings.state_dir / "stopped" / "beta.json"
    marker.parent.mkdir(exist_ok=True)
    marker.write_bytes(damaged_copies(b'{"endpoint": "beta", "by": "root"}')[damage])

    after = status_rows(env)
    assert after["alpha"] == before["alpha"]
    assert after["beta"]["stopped_by"].startswith("unknown (unreadable marker")
    assert boot_check(env, "alpha").returncode == 0
    assert boot_check(env, "beta").returncode == 1
    assert daemon_status(env)["alpha"]["state"] == before["alpha"]["state"]
    assert_clean(env.epycctl("stop", "alpha"), 0)


ODD_NAMES = ("-dash", ".hidden", "with space", "caf\u00e9", "UPPER", "a.b")


def test_endpoint_files_with_odd_names_affect_only_themselves(env: ApprovalSandbox) -> None:
    approve_two(env)
    before = status_rows(env)
    config = env.settings.config_dir
    for odd in ODD_NAMES:
        (config / f"{odd}.toml").write_text('model = "Qwen/Qwen3-0.6B"\n')

    after = status_rows(env)
    assert {n: after[n] for n in before} == before
    for odd in ODD_NAMES:
        assert after[odd]["state"] == "pending-approval"
        assert "not a valid endpoint name" in after[odd]["reason"]
    for odd in ODD_NAMES[:3]:
        for command in ("approve", "remove", "stop", "start", "logs"):
            assert_clean(env.epycctl(command, "--", odd), 1, 2)
        assert_clean(env.epycctl("status", "--", odd), 0, 2)
    assert boot_check(env, "alpha").returncode == 0
    by_daemon = daemon_status(env)
    assert {n: by_daemon[n]["state"] for n in before} == {n: before[n]["state"] for n in before}
    assert_clean(run_product(env, "plan", "--json"), 0, 1, 2)
