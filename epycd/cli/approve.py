"""`epycctl approve NAME` and `epycctl remove NAME`: the person's gate in front of systemd."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from epycd.approval.permissions import require_admin
from epycd.approval.record import (
    approved_plans,
    checked_name,
    current_approver,
    readable_approval,
)
from epycd.approval.workflow import (
    gate,
    install_approved,
    main_service,
    make_approval,
    recover_interrupted,
    removal_files,
    start_approved,
)
from epycd.approval.workflow import remove_endpoint as remove_files_and_approval
from epycd.cli.output import ActionReport, json_option
from epycd.cli.plan import confirmation_table
from epycd.errors import InputError, Refusal
from epycd.events import EPYCCTL, Event, emit
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.prepared import Prerequisite
from epycd.settings import Settings, load_settings
from epycd.text import escaped

P = ParamSpec("P")
R = TypeVar("R")


def current_plan(settings: Settings, name: str) -> tuple[EndpointResult, HostFacts]:
    """Plan every endpoint file together (disjoint sockets, distinct ports), exactly as
    `epycctl plan` does; NAME's result."""
    from epycd.plan.pipeline.current import endpoint_specs, plan_endpoints
    from epycd.render import render_for_plan

    specs = endpoint_specs(settings)
    if name not in {spec.name for spec in specs}:
        raise InputError(
            "no such endpoint file",
            file=settings.config_dir / f"{name}.toml",
            fix="`epycctl status` lists the endpoints",
        )
    planned = plan_endpoints(
        settings, approved_plans(settings), render=render_for_plan, specs=specs
    )
    return next(r for r in planned.results if r.endpoint == name), planned.host


def make_first(
    name: str,
    prerequisite: Prerequisite,
    settings: Settings,
    *,
    yes: bool,
    show: Callable[[str], None],
    progress: Callable[[str], None],
    err: bool = False,
) -> str:
    """What NAME's plan waits for (its model converted), said, asked for and made, its
    progress to `progress`; its words. Nothing starts: the plan is asked for as ever."""
    from epycd.approval.prerequisites import make_prerequisite, maker_for

    what = maker_for(prerequisite).describe(prerequisite)
    show(f"{name} is planned once approve has made what it needs: {what}\n")
    ask(f"{what[0].upper()}{what[1:]} (nothing starts)?", yes=yes, err=err)
    make_prerequisite(
        prerequisite, settings, lambda line: progress(f"{prerequisite.action}: {line}")
    )
    return what


def made_first(
    settings: Settings,
    name: str,
    result: EndpointResult,
    host: HostFacts,
    report: ActionReport,
    *,
    yes: bool,
) -> tuple[EndpointResult, HostFacts]:
    """`make_first`, then NAME planned again (also when making it changed the plan)."""
    from epycd.approval.prerequisites import PlanChanged

    assert result.prerequisite is not None
    try:
        what = make_first(
            name,
            result.prerequisite,
            settings,
            yes=yes,
            show=report.show,
            progress=lambda line: click.echo(escaped(line), err=True),
            err=report.as_json,
        )
    except PlanChanged as changed:
        report.say(f"{name}: {changed.message}; planned again")
        return current_plan(settings, name)
    report.say(f"{name}: made what its plan needs ({what})")
    return current_plan(settings, name)


def planned_or_refused(result: EndpointResult) -> Plan:
    """The plan, or every error of the endpoint at its exit code (2 bad input, 1 refused)."""
    if result.plan is not None:
        return result.plan
    error = Refusal if result.exit_code == Refusal.exit_code else InputError
    raise error(
        f"{result.endpoint} cannot be approved: " + "; ".join(p.text for p in result.errors),
        fix=f"see `epycctl plan {result.endpoint}`",
    )


def units_text(plan: Plan, targets: dict[str, str]) -> str:
    return "\n".join(f"# {targets[name]}\n{text.rstrip()}\n" for name, text in plan.units.items())


def ask(question: str, *, yes: bool, err: bool = False) -> None:
    """Yes from --yes or a person on a terminal; anything else is no (exit 1). `err` asks
    on stderr, keeping stdout for --json."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise Refusal(
            "no terminal to ask on and no --yes: nothing changed",
            fix="run it on a terminal, or pass --yes from a script",
        )
    if not click.confirm(question, default=False, err=err):
        raise Refusal("not approved: nothing changed")


def consent_options(func: Callable[P, R]) -> Callable[P, R]:
    """--yes, --accept-unvalidated and --no-pull: how a person consents, shared by `approve`
    and `quickstart`."""
    for option in reversed(
        [
            click.option("--yes", "-y", is_flag=True, help="Approve without asking (scripts)."),
            click.option(
                "--accept-unvalidated",
                is_flag=True,
                help="Consent to a stock or unvalidated path the plan flags as needing it.",
            ),
            click.option(
                "--no-pull", is_flag=True, help="Do not pull the container image (it is preloaded)."
            ),
        ]
    ):
        func = option(func)
    return func


@click.command()
@click.argument("name")
@consent_options
@click.option(
    "--no-start", is_flag=True, help="Write units and approval only; do not touch systemd."
)
@json_option("Print the outcome as JSON (not the plan and units).", errors_too=True)
def approve(
    name: str, yes: bool, accept_unvalidated: bool, no_start: bool, no_pull: bool, as_json: bool
) -> None:
    """Show NAME's plan, ask, record the approval, install the units and start them.

    The image is pulled even with --no-start (units use Pull=never, so a unit written for
    the next boot needs its image present); --no-pull skips that.
    """
    settings = load_settings()
    checked_name(name)
    report = ActionReport(name, "approve", as_json=as_json)
    require_admin(settings, "approve")
    for line in recover_interrupted(settings):
        report.say(line)
    result, host = current_plan(settings, name)
    if result.prerequisite is not None:
        result, host = made_first(settings, name, result, host, report, yes=yes)
    report.show(f"Plan for endpoint {name} ({result.config_file})\n")
    report.show(confirmation_table(result, host) + "\n")
    plan = planned_or_refused(result)
    approval = make_approval(
        settings, plan, host, current_approver(), accepted_unvalidated=accept_unvalidated
    )
    report.show(units_text(plan, {n: r.path for n, r in approval.units.items()}))
    report.show(f"fingerprint {plan.fingerprint}\n")
    gate(plan, accept_unvalidated=accept_unvalidated)
    previous = readable_approval(settings, name)
    if previous is not None and previous.fingerprint == plan.fingerprint:
        report.say(f"{name} is already approved at this fingerprint; approving it again.")
    ask(f"Approve {name} and install these units?", yes=yes, err=as_json)
    installed = install_approved(
        settings, approval, pull=not no_pull, touch_systemd=not no_start, log=report.say
    )
    outcome = {
        "fingerprint": plan.fingerprint,
        "approver": approval.approver.describe(),
        "units": [str(path) for path in installed.paths],
    }
    if no_start:
        report.done(
            "approved",
            "--no-start: systemd not touched; the units start at the next boot",
            **outcome,
        )
        return
    by = approval.approver.describe()
    said = f"{name}: starting {main_service(approval)}, approved by {by}"
    emit(Event.START, name, said, identifier=EPYCCTL, reason=f"approved by {by}")
    start_approved(approval, installed.previous, report.say)
    decided = approval.plan.decisions
    if decided.on_demand is not None:
        said = f"{name} listens on {decided.host}:{decided.port}; the first request starts it"
        report.done("started", f"{said}: `epycctl status {name}`", **outcome)
        return
    report.done("started", f"{name} started: `epycctl status {name}`", **outcome)


@click.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Remove without asking (scripts).")
@click.option(
    "--no-stop", is_flag=True, help="Delete units and approval only; do not touch systemd."
)
@json_option("Print what was removed as JSON.", errors_too=True)
def remove(name: str, yes: bool, no_stop: bool, as_json: bool) -> None:
    """Stop and disable endpoint NAME, delete its units and its approval."""
    settings = load_settings()
    checked_name(name)
    report = ActionReport(name, "remove", as_json=as_json)
    require_admin(settings, "remove")
    approval = readable_approval(settings, name)
    files = removal_files(settings, name, approval)
    report.show(f"remove {name}: stop, disable, delete:")
    for path in files:
        report.show(f"  {path}")
    if approval:
        report.show(f"  the approval by {approval.approver.describe()}")
    ask(f"Remove {name}?", yes=yes, err=as_json)
    removed = remove_files_and_approval(settings, name, touch_systemd=not no_stop, log=report.say)
    by = current_approver().describe()
    emit(Event.REMOVE, name, f"removed {name} by {by}", identifier=EPYCCTL, reason=f"by {by}")
    report.done("removed", removed_message(settings, name), removed=[str(p) for p in removed])


def removed_message(settings: Settings, name: str) -> str:
    """What was removed, and the endpoint file that stays: the admin's own, planned (and
    holding its socket) as pending approval until it is deleted."""
    file = settings.config_dir / f"{name}.toml"
    if not file.is_file():
        return f"removed {name}"
    return (
        f"removed {name}; its endpoint file {file} stays, pending approval, and keeps its "
        f"socket in the plan: delete the file to free it, or `epycctl approve {name}` again"
    )
