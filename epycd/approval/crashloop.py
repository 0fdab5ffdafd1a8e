"""The crash recorder (docs/healing.md, "Crash loop"), run by systemd as root after every run of
an endpoint's vLLM unit (ExecStopPost=, with SERVICE_RESULT, EXIT_CODE and EXIT_STATUS in its
environment):

    python -m epycd.approval.crashloop NAME --unit UNIT

UNIT is `epyc-llm-NAME`, or `epyc-llm-NAME_N` for instance N of a set. A run systemd was
asked to stop (a stop or restart job of the unit runs: `systemctl stop`, a shutdown), however
it exited, or a start the approval check skipped counts for nothing; a run that ended by
itself is a failure, a clean exit too. A failed run is appended to
`STATE_DIR/crashloop/UNIT.json` with how it ended and why (the reason and first error the
supervisor left in its status file), with one journal line; the
failures older than the approved plan's `healing.start_limit_interval_s` are dropped, and
when `healing.start_limit_burst` remain the record gets its verdict, "crash-loop", with one
more journal line. The boot-time check (`epycd.approval.check`) then refuses every start of
the unit, the restarts and the next boot's too, until `epycctl start NAME` clears the record.

An approval without `healing` (made before the healing policy) records nothing. The recorder
never fails the unit's stop: its own errors are one journal line and exit 0.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import click
from pydantic import BaseModel, Field, ValidationError

from epycd.approval.record import load_approval
from epycd.atomic import unlink_durable, write_atomic
from epycd.errors import EpycError, InputError, file_error
from epycd.names import INSTANCE_SEPARATOR, unit_name
from epycd.plan.endpoint import Plan
from epycd.plan.healing import Healing
from epycd.plan.model import EndpointService
from epycd.readfile import STATE_MAX_BYTES, read_bytes
from epycd.settings import Settings, load_settings
from epycd.supervisor import SupervisorStatus, read_status
from epycd.systemd import unit_jobs
from epycd.text import escaped

CRASHLOOP = "crashloop"
CRASH_LOOP: Literal["crash-loop"] = "crash-loop"
SKIPPED = "exec-condition"
"""SERVICE_RESULT of a start the approval check skipped (ExecCondition=): not a run."""
STOP_JOBS = frozenset({"stop", "restart", "try-restart", "reload-or-restart"})
"""Job types of a unit that systemd was asked to stop (a person's stop or restart, a
shutdown): its run ends as asked, whatever its exit status says."""
SIGNAL_RESULTS = frozenset({"signal", "core-dump"})


class Failure(BaseModel):
    """One failed run of a unit."""

    at: datetime
    result: str = Field(description="systemd's SERVICE_RESULT: exit-code, signal, watchdog, ...")
    exit_code: str = Field(default="", description="EXIT_CODE: exited, killed, dumped")
    exit_status: str = Field(default="", description="EXIT_STATUS: a number or a signal name")
    how: str = Field(description='how it ended, as a person reads it: "exit-code 1", "watchdog"')
    reason: str = Field(default="", description="why, from the supervisor's status file")
    first_error: list[str] = Field(default_factory=list)


class Verdict(BaseModel):
    """The unit is in a crash loop: it stays down until `epycctl start NAME`."""

    state: Literal["crash-loop"] = CRASH_LOOP
    since: datetime
    failures: int
    interval_s: int
    last: str = Field(description="how the last run ended and why")
    first_error: list[str] = Field(default_factory=list)


class CrashRecord(BaseModel):
    """`STATE_DIR/crashloop/UNIT.json`: a unit's failed runs within the start limit interval,
    and its verdict once they reached the burst."""

    endpoint: str
    unit: str
    failures: list[Failure] = Field(default_factory=list)
    verdict: Verdict | None = None


def crashloop_dir(settings: Settings) -> Path:
    return settings.state_dir / CRASHLOOP


def unit_stem(name: str, unit: str | None = None) -> str:
    """The unit stem `unit` names (`epyc-llm-NAME`, `epyc-llm-NAME_N`, `.service` allowed),
    the endpoint's main unit without one; InputError when it is not one of NAME's units."""
    main = unit_name(name)
    if unit is None:
        return main
    stem = unit.removesuffix(".service")
    if not re.fullmatch(rf"{re.escape(main)}({INSTANCE_SEPARATOR}[0-9]+)?", stem):
        raise InputError(
            f"--unit {unit!r} is not a unit of endpoint {name}",
            key="--unit",
            fix=f"{main} or {main}{INSTANCE_SEPARATOR}N",
        )
    return stem


def crash_path(settings: Settings, stem: str) -> Path:
    return crashloop_dir(settings) / f"{stem}.json"


def read_crash_record(settings: Settings, stem: str) -> CrashRecord | None:
    """The unit's record; None when it has none or it cannot be read as one (the next failed
    run writes a new one)."""
    try:
        return CrashRecord.model_validate_json(
            read_bytes(crash_path(settings, stem), STATE_MAX_BYTES)
        )
    except (OSError, ValueError, ValidationError):
        return None


def unit_stems(plan: Plan) -> list[str]:
    """Every vLLM unit of an approved endpoint that can have a record: its own, and its
    instances' (a set's own unit is its balancer)."""
    members = plan.decisions.members
    return [plan.unit_name, *(member.unit_name for member in members)]


def recorded_stems(settings: Settings, name: str) -> list[str]:
    """The units of endpoint `name` that have a crash record, whatever approval made them."""
    main = unit_name(name)
    folder = crashloop_dir(settings)
    if not folder.is_dir():
        return []
    pattern = re.compile(rf"{re.escape(main)}({INSTANCE_SEPARATOR}[0-9]+)?")
    return sorted(p.stem for p in folder.glob(f"{main}*.json") if pattern.fullmatch(p.stem))


def clear_crash_records(settings: Settings, stems: Iterable[str]) -> list[str]:
    """Delete the units' records (failures and verdicts); the stems that had a verdict."""
    cleared = []
    for stem in dict.fromkeys(stems):
        record = read_crash_record(settings, stem)
        if record is not None and record.verdict is not None:
            cleared.append(stem)
        unlink_durable(crash_path(settings, stem))
    return cleared


def how_it_ended(result: str, exit_code: str, exit_status: str) -> str:
    """ "exit-code 1", "signal KILL", "watchdog", "timeout", ... from systemd's variables."""
    if result == "exit-code" and exit_status:
        return f"exit-code {exit_status}"
    if result in SIGNAL_RESULTS and exit_status:
        return f"signal {exit_status}"
    return result or exit_code or "unknown"


def why_this_run(status: SupervisorStatus | None, invocation: str | None) -> tuple[str, list[str]]:
    """(reason, first error) from the status file if this run (systemd's INVOCATION_ID)
    wrote it. A run that ended before its supervisor wrote (killed at once, or it never
    started) leaves an earlier run's there, whose reason must not be named as this run's."""
    if status is None or not invocation or status.invocation in (None, invocation):
        return why(status)
    return "ended before its supervisor said anything", []


def why(status: SupervisorStatus | None) -> tuple[str, list[str]]:
    """(reason, first error) of the run, from the supervisor's last word."""
    if status is None:
        return "", []
    if status.state == "failed":
        return f"failed in phase {status.phase or 'unknown'}: {status.reason}", status.first_error
    if status.state == "ready":
        return status.unhealthy or "", status.first_error
    if status.state == "starting":
        return f"ended while starting (phase {status.phase or 'unknown'})", status.first_error
    return status.reason, status.first_error


def target_of(plan: Plan, stem: str) -> EndpointService | None:
    if stem == plan.unit_name:
        return plan.decisions
    members = plan.decisions.members
    return next((member for member in members if member.unit_name == stem), None)


def label(name: str, target: EndpointService) -> str:
    instance = target.instance
    return name if instance is None else f"{name} instance {instance}"


def restart_text(healing: Healing) -> str:
    if healing.restart == "no":
        return "no restart (Restart=no)"
    return f"restart in {healing.restart_sec} s"


def failure_text(failure: Failure) -> str:
    return f"{failure.how}: {failure.reason}" if failure.reason else failure.how


def asked_to_stop(
    stem: str, environ: Mapping[str, str], jobs: Callable[..., list[str] | None]
) -> bool | None:
    """Whether systemd was stopping the unit `stem` when its run ended (a stop or restart
    job runs), or None when its manager cannot be asked: not run by systemd (which gives
    every process of a unit its INVOCATION_ID), or no answer. A user manager sets
    MANAGERPID."""
    if not environ.get("INVOCATION_ID"):
        return None
    found = jobs(f"{stem}.service", user="MANAGERPID" in environ)
    return None if found is None else bool(STOP_JOBS.intersection(found))


def record_run(
    settings: Settings,
    name: str,
    unit: str,
    environ: Mapping[str, str],
    now: datetime,
    jobs: Callable[..., list[str] | None] = unit_jobs,
) -> list[str]:
    """Record how the run of `unit` ended; the journal lines to print.

    A run that systemd was asked to stop is never a failure, whatever its exit status (a
    server slow to shut down at a reboot); one that ended by itself always is, even with
    status 0 (vLLM in a container exits 0 when its EngineCore dies). Where the manager
    cannot be asked, a clean end counts for nothing."""
    stem = unit_stem(name, unit)
    result = environ.get("SERVICE_RESULT", "")
    if not result:
        return [f"{stem}: no SERVICE_RESULT: the crash recorder runs from ExecStopPost="]
    if result == SKIPPED:
        return []
    how = how_it_ended(result, environ.get("EXIT_CODE", ""), environ.get("EXIT_STATUS", ""))
    asked = asked_to_stop(stem, environ, jobs)
    if asked:
        return [] if result == "success" else [f"{stem}: stopped as asked ({how}): not a failure"]
    if result == "success":
        if asked is None:
            return []
        how = "exited 0 by itself"
    approval = load_approval(settings, name)
    if approval is None:
        return [f"{stem}: no approval record of {name}: the failed run is not recorded"]
    target = target_of(approval.plan, stem)
    if target is None:
        return [f"{stem}: not a unit of the approved endpoint {name}: nothing recorded"]
    healing = target.healing or approval.plan.decisions.healing
    if healing is None:
        return []
    status = read_status(Path(target.status_file)) if target.status_file else None
    reason, first_error = why_this_run(status, environ.get("INVOCATION_ID"))
    failure = Failure(
        at=now,
        result=result,
        exit_code=environ.get("EXIT_CODE", ""),
        exit_status=environ.get("EXIT_STATUS", ""),
        how=how,
        reason=reason,
        first_error=first_error,
    )
    record = read_crash_record(settings, stem) or CrashRecord(endpoint=name, unit=stem)
    window = timedelta(seconds=healing.start_limit_interval_s)
    record.failures = [f for f in record.failures if now - f.at < window] + [failure]
    count, burst = len(record.failures), healing.start_limit_burst
    who = label(name, target)
    ended = f"{who} run failed ({failure.how})" + (f": {reason}" if reason else "")
    if count < burst and record.verdict is None:
        write_atomic(crash_path(settings, stem), record_json(record))
        return [f"{ended}; {restart_text(healing)} ({count} of {burst})"]
    before = record.verdict
    record.verdict = Verdict(
        since=before.since if before is not None else now,
        failures=max(count, before.failures if before is not None else 0),
        interval_s=healing.start_limit_interval_s,
        last=failure_text(failure),
        first_error=first_error,
    )
    write_atomic(crash_path(settings, stem), record_json(record))
    return [
        f"{ended}; no restart: crash loop ({count} of {burst})",
        f"{who}: crash loop: {record.verdict.failures} runs failed within "
        f"{healing.start_limit_interval_s} s, last: {failure_text(failure)}; "
        f"`epycctl start {name}` to try again",
    ]


def record_json(record: CrashRecord) -> bytes:
    return (record.model_dump_json(indent=2) + "\n").encode()


def verdict_text(name: str, verdict: Verdict) -> str:
    """The crash loop as status says it."""
    return (
        f"crash loop since {verdict.since:%Y-%m-%d %H:%M:%S %Z}: {verdict.failures} runs "
        f"failed within {verdict.interval_s} s, last: {verdict.last}; "
        f"`epycctl start {name}` to try again"
    )


def verdict_line(name: str, stem: str, verdict: Verdict) -> str:
    """The boot-time check's refusal."""
    return f"{stem}: {verdict_text(name, verdict)}"


def recent(record: CrashRecord | None, healing: Healing | None, now: datetime) -> list[Failure]:
    """The record's failures within the start limit interval before `now`."""
    if record is None:
        return []
    if healing is None:
        return list(record.failures)
    window = timedelta(seconds=healing.start_limit_interval_s)
    return [f for f in record.failures if now - f.at < window]


@click.command(name="epycd-crashloop")
@click.argument("name")
@click.option("--unit", required=True, help="the unit whose run ended: epyc-llm-NAME[_N]")
def main(name: str, unit: str) -> None:
    """Record how a run of endpoint NAME's UNIT ended; declare a crash loop. Always exit 0."""
    try:
        lines = record_run(load_settings(), name, unit, os.environ, datetime.now(UTC))
    except EpycError as exc:
        lines = [f"{unit}: crash recorder failed: {exc}"]
    except OSError as exc:
        lines = [f"{unit}: crash recorder failed: {file_error(exc)}"]
    except Exception as exc:  # never fail the unit's stop; say what went wrong
        lines = [f"{unit}: crash recorder failed: {type(exc).__name__}: {exc}"]
    for line in lines:
        click.echo(escaped(line), err=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
