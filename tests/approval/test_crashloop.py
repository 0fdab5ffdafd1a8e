"""The crash recorder (`python -m epycd.approval.crashloop NAME --unit UNIT`, every vLLM unit's
ExecStopPost=) and the boot-time check's refusal of a unit in a crash loop, as systemd runs
them: subprocesses with SERVICE_RESULT, EXIT_CODE and EXIT_STATUS in their environment, on
approvals made by the real `epycctl approve` (docs/healing.md, "Crash loop")."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from epycd.approval.crashloop import (
    CrashRecord,
    Failure,
    crash_path,
    read_crash_record,
    record_run,
)
from epycd.paths import endpoint_status_file
from epycd.plan.endpoint import Plan
from epycd.plan.healing import Healing
from epycd.supervisor import SupervisorStatus, write_status
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.render.fixtures import with_decisions

UNIT = "epyc-llm-chat"
HEALING = Healing(
    restart="on-failure",
    restart_sec=10,
    start_limit_burst=3,
    start_limit_interval_s=600,
    watchdog_s=30,
    stall_s=120,
)
LOAD_ERROR = [
    "Traceback (most recent call last):",
    '  File "safetensors/torch.py", line 1, in load_file',
    "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata",
]


def approve(env: ApprovalSandbox, healing: Healing | None = HEALING) -> Plan:
    plan = make_plan("chat", env.host(), env.settings.config_dir)
    status_file = str(endpoint_status_file(env.settings.run_dir, "chat"))
    plan = with_decisions(plan, healing=healing, status_file=status_file)
    env.set_plans(plan)
    done = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stderr
    return plan


def supervisor_says(env: ApprovalSandbox, state: str, **fields: object) -> None:
    write_status(
        endpoint_status_file(env.settings.run_dir, "chat"),
        SupervisorStatus.model_validate(
            {"state": state, "name": "chat", "url": "http://127.0.0.1:8000", "model": "tiny"}
            | fields
        ),
    )


def ended(
    env: ApprovalSandbox,
    result: str,
    code: str = "exited",
    status: str = "1",
    unit: str = UNIT,
) -> subprocess.CompletedProcess[str]:
    """One run of `unit` ended as systemd tells ExecStopPost=."""
    done = env.epycctl(
        "chat",
        "--unit",
        unit,
        module="epycd.approval.crashloop",
        SERVICE_RESULT=result,
        EXIT_CODE=code,
        EXIT_STATUS=status,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    return done


def boot_check(env: ApprovalSandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return env.epycctl("chat", *args, module="epycd.approval.check")


@pytest.mark.parametrize("result", ["success", "exec-condition"])
def test_a_clean_end_or_a_skipped_start_counts_for_nothing(
    env: ApprovalSandbox, result: str
) -> None:
    approve(env)
    done = ended(env, result, "exited", "0")
    assert done.stderr == ""
    assert not crash_path(env.settings, UNIT).exists()


def run_ended(env: ApprovalSandbox, result: str, status: str, jobs: list[str] | None) -> list[str]:
    """One run ended, the recorder in this process, systemd's jobs of the unit as given."""
    environ = {"SERVICE_RESULT": result, "EXIT_CODE": "exited", "EXIT_STATUS": status}
    environ["INVOCATION_ID"] = "0123456789abcdef0123456789abcdef"
    asked: list[tuple[str, bool]] = []

    def unit_jobs(unit: str, *, user: bool) -> list[str] | None:
        asked.append((unit, user))
        return jobs

    lines = record_run(env.settings, "chat", UNIT, environ, datetime.now(UTC), unit_jobs)
    assert asked == [(f"{UNIT}.service", False)]
    return lines


def test_runs_systemd_was_asked_to_stop_never_make_a_crash_loop(env: ApprovalSandbox) -> None:
    """A server that exits 1 when it is stopped (slow to shut down at a reboot)
    ends a run systemd asked to end: three such stops are no crash loop. Before, each one
    counted, and with two real faults after them the endpoint was kept down."""
    approve(env)
    supervisor_says(env, "stopped", reason="stopped by signal 15; server exited with status 1")
    for job in ("stop", "restart", "stop"):
        lines = run_ended(env, "exit-code", "1", [job])
        assert lines == [f"{UNIT}: stopped as asked (exit-code 1): not a failure"]
    assert run_ended(env, "success", "0", ["stop"]) == []
    assert not crash_path(env.settings, UNIT).exists()
    assert boot_check(env).returncode == 0


def test_a_clean_exit_nobody_asked_for_is_a_failed_run(env: ApprovalSandbox) -> None:
    """vLLM exits 0 when its EngineCore dies (a container has no supervisor to
    turn that into a failure): a run that ended by itself with status 0 is a failed run.
    Where the manager cannot be asked, a clean end still counts for nothing."""
    approve(env)
    supervisor_says(env, "failed", phase="serving", reason="server exited with status 0")
    [line] = run_ended(env, "success", "0", [])
    assert line.startswith("chat run failed (exited 0 by itself): failed in phase serving"), line
    record = read_crash_record(env.settings, UNIT)
    assert record is not None and [f.how for f in record.failures] == ["exited 0 by itself"]
    assert run_ended(env, "success", "0", None) == []
    assert run_ended(env, "exit-code", "1", ["start"])[0].startswith("chat run failed"), (
        "a start job is no stop: a start that failed is a failure"
    )
    record = read_crash_record(env.settings, UNIT)
    assert record is not None and len(record.failures) == 2


def test_a_run_is_named_by_its_own_status_never_an_earlier_runs(env: ApprovalSandbox) -> None:
    """After the watchdog killed a hung run, a run that ended before its supervisor
    wrote its status was recorded with the hung run's reason ("health not answering"): the
    status file names its run (INVOCATION_ID) and only that run's word is taken."""
    approve(env)
    hung = "killed by systemd's watchdog (signal 6): health not answering for 23 s"
    supervisor_says(env, "failed", phase="watchdog", reason=hung, invocation="run-1")
    environ = {"SERVICE_RESULT": "watchdog", "INVOCATION_ID": "run-1"}
    [line] = record_run(
        env.settings, "chat", UNIT, environ, datetime.now(UTC), lambda *_a, **_k: []
    )
    assert f"failed in phase watchdog: {hung}" in line
    environ = {"SERVICE_RESULT": "signal", "EXIT_STATUS": "KILL", "INVOCATION_ID": "run-2"}
    [line] = record_run(
        env.settings, "chat", UNIT, environ, datetime.now(UTC), lambda *_a, **_k: []
    )
    assert line.startswith("chat run failed (signal KILL): ended before its supervisor said"), line
    record = read_crash_record(env.settings, UNIT)
    assert record is not None
    assert [f.reason for f in record.failures] == [
        f"failed in phase watchdog: {hung}",
        "ended before its supervisor said anything",
    ]


def test_three_failed_runs_make_a_crash_loop_the_boot_check_refuses(env: ApprovalSandbox) -> None:
    approve(env)
    supervisor_says(
        env,
        "failed",
        phase="health",
        reason="server exited while loading (ConnectError)",
        first_error=LOAD_ERROR,
    )
    why = "failed in phase health: server exited while loading (ConnectError)"
    for run in (1, 2):
        done = ended(env, "exit-code")
        assert done.stderr.splitlines() == [
            f"chat run failed (exit-code 1): {why}; restart in 10 s ({run} of 3)"
        ]
        assert boot_check(env).returncode == 0, "no crash loop yet"
    done = ended(env, "exit-code")
    assert done.stderr.splitlines() == [
        f"chat run failed (exit-code 1): {why}; no restart: crash loop (3 of 3)",
        f"chat: crash loop: 3 runs failed within 600 s, last: exit-code 1: {why}; "
        "`epycctl start chat` to try again",
    ]
    record = read_crash_record(env.settings, UNIT)
    assert record is not None and record.verdict is not None
    assert (record.endpoint, record.unit, len(record.failures)) == ("chat", UNIT, 3)
    assert record.verdict.failures == 3 and record.verdict.first_error == LOAD_ERROR
    assert crash_path(env.settings, UNIT).stat().st_mode & 0o777 == 0o644

    refused = boot_check(env)
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"{UNIT}: crash loop since ")
    assert line.endswith(
        f"3 runs failed within 600 s, last: exit-code 1: {why}; `epycctl start chat` to try again"
    )
    assert boot_check(env, "--unit", f"{UNIT}.service").returncode == 1

    later = ended(env, "exit-code")
    assert "crash loop" in later.stderr, "a run after the verdict keeps it"
    record = read_crash_record(env.settings, UNIT)
    assert record is not None and record.verdict is not None and record.verdict.failures == 4


def test_how_a_run_ended_and_why(env: ApprovalSandbox) -> None:
    """The watchdog's kill names what the supervisor saw; a signal names the signal."""
    approve(env)
    supervisor_says(
        env, "ready", phase="serving", unhealthy="engine stalled: 2 requests running, no "
        "tokens for 121 s"
    )  # fmt: skip
    done = ended(env, "watchdog", "killed", "KILL")
    assert done.stderr.strip() == (
        "chat run failed (watchdog): engine stalled: 2 requests running, no tokens for 121 s; "
        "restart in 10 s (1 of 3)"
    )
    supervisor_says(
        env, "failed", phase="serving", reason="server exited with status -9 while serving"
    )
    done = ended(env, "signal", "killed", "KILL")
    assert done.stderr.strip() == (
        "chat run failed (signal KILL): failed in phase serving: server exited with status -9 "
        "while serving; restart in 10 s (2 of 3)"
    )
    record = read_crash_record(env.settings, UNIT)
    assert record is not None
    assert [(f.result, f.exit_code, f.exit_status, f.how) for f in record.failures] == [
        ("watchdog", "killed", "KILL", "watchdog"),
        ("signal", "killed", "KILL", "signal KILL"),
    ]


def test_failures_older_than_the_interval_do_not_count(env: ApprovalSandbox) -> None:
    approve(env)
    old = datetime.now(UTC) - timedelta(seconds=HEALING.start_limit_interval_s + 5)
    record = CrashRecord(
        endpoint="chat",
        unit=UNIT,
        failures=[Failure(at=old, result="exit-code", how="exit-code 1") for _ in range(2)],
    )
    path = crash_path(env.settings, UNIT)
    path.parent.mkdir(parents=True)
    path.write_text(record.model_dump_json())
    done = ended(env, "exit-code")
    assert done.stderr.strip().endswith("restart in 10 s (1 of 3)"), done.stderr
    kept = read_crash_record(env.settings, UNIT)
    assert kept is not None and len(kept.failures) == 1 and kept.verdict is None


def test_restart_no_says_so(env: ApprovalSandbox) -> None:
    approve(env, HEALING.model_copy(update={"restart": "no"}))
    done = ended(env, "exit-code", status="2")
    assert done.stderr.strip() == "chat run failed (exit-code 2); no restart (Restart=no) (1 of 3)"


def test_an_approval_before_healing_records_nothing(env: ApprovalSandbox) -> None:
    approve(env, healing=None)
    done = ended(env, "exit-code")
    assert done.stderr == ""
    assert not crash_path(env.settings, UNIT).exists()


def test_its_own_errors_are_one_line_and_exit_0(env: ApprovalSandbox) -> None:
    """The recorder never fails the unit's stop: no approval, a unit of another endpoint, a
    state folder it cannot write, or no SERVICE_RESULT (run by hand)."""
    done = ended(env, "exit-code")
    assert (
        done.stderr.strip() == f"{UNIT}: no approval record of chat: the failed run is not recorded"
    )
    approve(env)
    other = ended(env, "exit-code", unit="epyc-llm-other")
    [line] = other.stderr.splitlines()
    assert "is not a unit of endpoint chat" in line and "crash recorder failed" in line
    absent = ended(env, "exit-code", unit=f"{UNIT}_7")
    assert (
        absent.stderr.strip()
        == f"{UNIT}_7: not a unit of the approved endpoint chat: nothing recorded"
    )
    (env.settings.state_dir / "crashloop").write_text("not a folder")
    blocked = ended(env, "exit-code")
    [line] = blocked.stderr.splitlines()
    assert line.startswith(f"{UNIT}: crash recorder failed: ") and "Traceback" not in line
    by_hand = env.epycctl("chat", "--unit", UNIT, module="epycd.approval.crashloop")
    assert by_hand.returncode == 0
    assert "no SERVICE_RESULT" in by_hand.stderr


def test_a_damaged_record_is_replaced(env: ApprovalSandbox) -> None:
    approve(env)
    path = crash_path(env.settings, UNIT)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert boot_check(env).returncode == 0, "a damaged record is no verdict"
    done = ended(env, "exit-code")
    assert "(1 of 3)" in done.stderr
    assert json.loads(path.read_text())["unit"] == UNIT


def test_the_check_takes_only_units_of_the_endpoint(env: ApprovalSandbox) -> None:
    approve(env)
    assert boot_check(env, "--unit", f"{UNIT}_2").returncode == 0
    for wrong in ("epyc-llm-other", "../x", f"{UNIT}_a", f"{UNIT}.container"):
        done = boot_check(env, "--unit", wrong)
        assert done.returncode == 2, (wrong, done.stderr)
        assert "is not a unit of endpoint chat" in done.stderr and "Traceback" not in done.stderr


def test_the_stop_marker_is_named_before_the_crash_loop(env: ApprovalSandbox) -> None:
    approve(env)
    for _ in range(3):
        ended(env, "exit-code")
    marker = env.settings.state_dir / "stopped" / "chat.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    done = boot_check(env)
    assert done.returncode == 1 and "stopped by the admin" in done.stderr


def test_remove_and_approve_clear_the_crash_records(env: ApprovalSandbox, tmp_path: Path) -> None:
    """A crash loop belongs to the approval it happened under: a new approval, or removing
    the endpoint, leaves no verdict behind for the next one."""
    approve(env)
    for _ in range(3):
        ended(env, "exit-code")
    again = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert again.returncode == 0, again.stderr
    assert "cleared the crash loop of epyc-llm-chat" in again.stdout
    assert not crash_path(env.settings, UNIT).exists()
    ended(env, "exit-code")
    removed = env.epycctl("remove", "chat", "--yes", "--no-stop")
    assert removed.returncode == 0, removed.stderr
    assert not crash_path(env.settings, UNIT).exists()
