"""`epycctl status [NAME]`, `stop NAME`, `start NAME`, `logs NAME`.

Anyone may read status and logs; stop and start are for admins (root or the admin group).
`stop` leaves a marker in `STATE_DIR/stopped/` so that neither the daemon nor a reboot starts
the endpoint again (Quadlet units cannot be disabled: their boot-time approval check
refuses while the marker is there); `start` takes it away, and clears a crash loop too: the
crash records of the endpoint's units (`STATE_DIR/crashloop/`) and systemd's failed state.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime

import click
from pydantic import ValidationError

from epycd.cli.bench import BenchResult, bench_path, bench_table
from epycd.cli.options import LOG_LINES
from epycd.cli.output import ActionReport, json_option, print_json, table
from epycd.errors import InputError, Refusal
from epycd.events import EPYCCTL, Event, emit
from epycd.settings import Settings, load_settings
from epycd.status.handoff import Handoff
from epycd.status.instances import InstanceLoad
from epycd.status.machine import SERVING, EndpointStatus
from epycd.text import escaped

JOURNAL_TAIL_LINES = 20
NEEDS_DAEMON = "tokens/s: needs epycd running (it keeps the last minute)"


def checked_settings(name: str | None) -> Settings:
    from epycd.approval.record import checked_name

    if name is not None:
        checked_name(name)
    return load_settings()


def journal_tail(unit: str) -> list[str]:
    """The unit's last journal lines, for a failure the supervisor did not describe."""
    from epycd import systemd

    try:
        text = systemd.journal([unit], lines=JOURNAL_TAIL_LINES)
    except systemd.SystemdError:
        return []
    return [line for line in text.splitlines() if line.strip() and not line.startswith("-- ")]


def current_statuses(settings: Settings) -> list[EndpointStatus]:
    from epycd.approval.record import approved_plans
    from epycd.plan.pipeline.current import plan_endpoints
    from epycd.render import render_for_plan
    from epycd.status.collect import collect_status, planned_map

    results, _host = plan_endpoints(settings, approved_plans(settings), render=render_for_plan)
    statuses = collect_status(settings, planned_map(results))
    for status in statuses:
        if status.kind == "failed" and not status.log_tail:
            status.log_tail = journal_tail(status.unit)
    return statuses


def loads_read_now(
    settings: Settings, name: str
) -> tuple[list[InstanceLoad], list[tuple[int, str]]]:
    """NAME's instances' load from their /metrics read once now, when no epycd keeps it:
    requests and KV usage as they are; tokens/s needs two readings (None). Also the
    instances that gave none, and why."""
    import time

    from epycd.approval.record import readable_approval
    from epycd.metrics.load import load_of, parse_sample
    from epycd.metrics.scrape import read_all, targets

    approval = readable_approval(settings, name)
    if approval is None:
        return [], []
    loads, unread = [], []
    for reading in read_all(targets([approval.plan])):
        instance = int(reading.target.vllm_instance)
        try:
            if reading.text is None:
                raise ValueError(reading.error)
            sample = parse_sample(reading.text, time.monotonic())
        except ValueError as exc:
            unread.append((instance, f"no load: {reading.target.url}: {exc}"))
            continue
        loads.append(load_of(instance, [sample]))
    return loads, unread


def add_loads(
    settings: Settings, statuses: list[EndpointStatus], name: str | None
) -> tuple[bool, list[tuple[int, str]]]:
    """The serving endpoints' load as the running epycd keeps it; for NAME without one, its
    /metrics read now. Whether the load is epycd's, and NAME's instances that gave none."""
    from epycd.status.daemon_file import daemon_loads

    kept = daemon_loads(settings)
    for item in statuses:
        item.load = kept.get(item.name, []) if item.state in SERVING else []
    serving = [item for item in statuses if item.name == name and item.state in SERVING]
    if not serving or serving[0].load:
        return True, []
    serving[0].load, unread = loads_read_now(settings, serving[0].name)
    return False, unread


def unknown_endpoint(settings: Settings, name: str) -> InputError:
    return InputError(
        f"no endpoint {name}: no endpoint file, approval or unit of that name",
        file=settings.config_dir / f"{name}.toml",
        fix="`epycctl status` lists the endpoints",
    )


def row(status: EndpointStatus) -> list[str]:
    def shown(value: object) -> str:
        return "-" if value is None or value == "" else str(value)

    return [
        status.name,
        status.state,
        shown(status.model),
        shown(status.port),
        shown(status.socket),
        shown(status.cpus),
        shown(status.kv_cache_gb),
        shown(status.url),
    ]


def _compute(handoff: Handoff) -> str:
    if handoff.gpus:
        return f"Instinct GPU(s) {handoff.gpus} (CPUs {handoff.cpus})"
    return f"{handoff.threads} OMP threads (CPUs {handoff.cpus})"


def python_title(handoff: Handoff) -> str:
    """The OpenAI client's, but for rerank, which the OpenAI API lacks (httpx posts it)."""
    return "Python (httpx)" if handoff.endpoint == "/v1/rerank" else "OpenAI Python client"


def handoff_text(handoff: Handoff) -> str:
    numa = ",".join(map(str, handoff.numa_nodes)) or "-"
    rows = [
        ("Base URL", f"{handoff.base_url}  (the trailing /v1 matters)"),
        ("Served model", f"{handoff.served_model_name}  (the id in /v1/models)"),
        ("Endpoint", handoff.endpoint),
        ("Why", handoff.why),
        ("Runtime / port", f"{handoff.runtime} / {handoff.port}"),
        ("Listens on", handoff.host),
        (
            "API key",
            f"required: the Bearer token in {handoff.api_key_file}"
            if handoff.api_key_file
            else "none",
        ),
        (
            "Sizing",
            _compute(handoff) + f", KV {handoff.kv_cache_gb} GiB,"
            f" max_model_len {handoff.max_model_len}, socket {handoff.socket}, NUMA {numa}",
        ),
        ("Stop", handoff.stop),
    ]
    return (
        table(rows, header=("Item", "Value"))
        + f"\n\nTry it:\n\n{handoff.curl}\n\n{python_title(handoff)}:\n\n{handoff.python}"
    )


def load_text(load: InstanceLoad, from_daemon: bool) -> str:
    text = f"running {load.running:g}, waiting {load.waiting:g}, "
    if load.kv_cache_usage is not None:
        text += f"KV {load.kv_cache_usage * 100:.0f} %, "
    if load.tokens_per_second is not None:
        return text + f"{load.tokens_per_second:g} tokens/s (last {load.window_seconds:g} s)"
    if from_daemon:
        return text + "tokens/s: after epycd's next reading (one so far)"
    return text + NEEDS_DAEMON


def load_lines(
    status: EndpointStatus, from_daemon: bool, unread: list[tuple[int, str]]
) -> list[str]:
    """The load of a serving endpoint: one line for a single endpoint, one per instance for
    a set; `unread` are the instances read now that gave none, and why."""
    if status.state not in SERVING:
        return []
    entries = sorted(
        [(load.instance, load_text(load, from_daemon)) for load in status.load] + unread
    )
    source = "" if from_daemon else " (read now)"
    if not status.instances and len(entries) == 1:
        return [f"  load{source}: {entries[0][1]}"]
    if not entries:
        return []
    return [f"  load{source}:"] + [f"    instance {n}: {text}" for n, text in entries]


def details(
    status: EndpointStatus, from_daemon: bool = True, unread: list[tuple[int, str]] | None = None
) -> str:
    """An endpoint's lines for a person. Each entry of `lines` is one line, and each is
    `escaped` where they are joined: a reason quotes what a model file or an endpoint file
    holds (an architecture, a name), whose newline must not start a line of its own. The
    blocks made of lines (the diff, the log tail, the hand-off) are split into theirs."""
    lines = ["", f"{status.name}: {status.state} (unit {status.unit}: {status.unit_state})"]
    if status.reason:
        lines.append(f"  {status.reason}")
    lines += [f"  {reason}" for reason in status.reasons if reason != status.reason]
    if status.instances:
        lines.append(f"  balancer {status.unit}: {status.balancer}")
        lines += [
            f"  instance {i.instance} {i.unit}: {i.state} (port {i.port}, CPUs {i.cpus}"
            + (f", restarts {i.restarts}" if i.restarts else "")
            + ")"
            + (f": {i.reason}" if i.reason else "")
            for i in status.instances
        ]
    lines += load_lines(status, from_daemon, unread or [])
    if status.crash_loop and status.crash_loop.first_error:
        lines.append("  first error of the last run:")
        lines += [f"    {line}" for line in status.crash_loop.first_error]
    if status.restarts or status.last_failure:
        lines.append(f"  restarts: {status.restarts} (failed runs within the start limit interval)")
    if status.last_failure:
        failure = status.last_failure
        why = f": {failure.reason}" if failure.reason else ""
        lines.append(f"  last failure {failure.at:%Y-%m-%d %H:%M:%S %Z}: {failure.how}{why}")
    if status.approved_by:
        lines.append(f"  approved by {status.approved_by}")
        if status.image:
            lines.append(f"  image {status.image} ({status.image_digest or 'digest unknown'})")
    if status.diff:
        lines += ["", "changes since approval (not applied):", *status.diff.rstrip().split("\n")]
    if status.log_tail:
        lines += ["", "last log lines:", *status.log_tail]
    if status.handoff:
        lines += ["", *handoff_text(status.handoff).split("\n")]
    return "\n".join(map(escaped, lines))


@click.command()
@click.argument("name", required=False)
@json_option("print the status as JSON")
def status(name: str | None, as_json: bool) -> None:
    """The state of every endpoint (or of NAME), and how to use a ready one."""
    settings = checked_settings(name)
    statuses = current_statuses(settings)
    if name is not None:
        statuses = [s for s in statuses if s.name == name]
        if not statuses:
            raise unknown_endpoint(settings, name)
    if name is None and len(statuses) > 1:
        for item in statuses:
            item.handoff = None
    from_daemon, unread = add_loads(settings, statuses, name)
    if as_json:
        data: dict[str, object] = {"endpoints": [s.model_dump(mode="json") for s in statuses]}
        if name is not None:
            last = last_bench(settings, name)
            data["last_bench"] = last.model_dump(mode="json") if last else None
        print_json(data)
        return
    if not statuses:
        click.echo(escaped(f"no endpoints: put NAME.toml files in {settings.config_dir}"))
        return
    header = ("NAME", "STATE", "MODEL", "PORT", "SOCKET", "CPUS", "KV GiB", "URL")
    click.echo(table([row(s) for s in statuses], header=header))
    for item in statuses:
        if name is not None or len(statuses) == 1 or item.state != "ready":
            click.echo(details(item, from_daemon, unread))
    last = last_bench(settings, name) if name is not None else None
    if last is not None:
        click.echo(f"\nlast bench ({last.measured_at:%Y-%m-%d %H:%M} UTC, "
                   f"random {last.input_len}/{last.output_len} tokens):")  # fmt: skip
        click.echo(bench_table(last))


def last_bench(settings: Settings, name: str) -> BenchResult | None:
    """The result `epycctl bench NAME` kept, if any."""
    try:
        from epycd.readfile import STATE_MAX_BYTES, read_bytes

        raw = read_bytes(bench_path(settings, name), STATE_MAX_BYTES)
        return BenchResult.model_validate_json(raw)
    except (OSError, ValidationError):
        return None


@click.command()
@click.argument("name")
@json_option("Print the outcome as JSON.", errors_too=True)
def stop(name: str, as_json: bool) -> None:
    """Stop endpoint NAME and keep it from starting at boot until `epycctl start NAME`."""
    from epycd.approval.permissions import require_admin
    from epycd.approval.record import current_approver, readable_approval
    from epycd.approval.workflow import is_quadlet, removal_files, stop_endpoint
    from epycd.atomic import write_atomic
    from epycd.status.stop import StopMarker, stop_marker_path

    settings = checked_settings(name)
    report = ActionReport(name, "stop", as_json=as_json)
    require_admin(settings, "stop")
    approval = readable_approval(settings, name)
    files = removal_files(settings, name, approval)
    if approval is None and not files:
        raise unknown_endpoint(settings, name)
    marker = StopMarker(endpoint=name, by=current_approver().describe(), at=datetime.now(UTC))
    write_atomic(stop_marker_path(settings, name), marker.model_dump_json(indent=2).encode())
    stop_endpoint(approval, name, files, report.say)
    emit(
        Event.STOP,
        name,
        f"{name} stopped by {marker.by}",
        identifier=EPYCCTL,
        state="stopped",
        reason=f"by {marker.by}",
    )
    if any(is_quadlet(path.name) for path in files):
        report.say(
            "Quadlet units cannot be disabled: at boot the unit's approval check refuses to "
            "start it while it is marked stopped"
        )
    report.done(
        "stopped",
        f"{name} stopped; it stays down (also across reboots) until `epycctl start {name}`",
    )


@click.command()
@click.argument("name")
@json_option("Print the outcome as JSON.", errors_too=True)
def start(name: str, as_json: bool) -> None:
    """Start approved endpoint NAME again (after `epycctl stop` or a crash loop), and at
    every boot."""
    from epycd import systemd
    from epycd.approval.crashloop import clear_crash_records, recorded_stems, unit_stems
    from epycd.approval.permissions import require_admin
    from epycd.approval.record import approved_plans, current_approver, readable_approval
    from epycd.approval.workflow import main_service, start_wait_s, units_to_enable
    from epycd.atomic import unlink_durable
    from epycd.plan.pipeline.current import plan_endpoints
    from epycd.render import render_for_plan
    from epycd.status.collect import collect_status, planned_map
    from epycd.status.stop import stop_marker_path

    settings = checked_settings(name)
    report = ActionReport(name, "start", as_json=as_json)
    require_admin(settings, "start")
    results, _host = plan_endpoints(settings, approved_plans(settings), render=render_for_plan)
    found = [s for s in collect_status(settings, planned_map(results)) if s.name == name]
    approval = readable_approval(settings, name)
    if not found:
        raise unknown_endpoint(settings, name)
    current = found[0]
    if approval is None or current.state in {
        "pending-approval",
        "changed-needs-approval",
        "orphaned",
        "damaged",
        "install-interrupted",
    }:
        said = "; ".join(current.reasons) or current.state
        if current.diff:
            report.say(f"changes since approval:\n{current.diff.rstrip()}", err=True)
        raise Refusal(
            f"{name} is {current.state}, not startable: {said}",
            fix=f"`epycctl plan {name}`, then `epycctl approve {name}`",
        )
    unlink_durable(stop_marker_path(settings, name))
    for stem in clear_crash_records(settings, recorded_stems(settings, name)):
        report.say(f"cleared the crash loop of {stem}")
    services = [f"{stem}.service" for stem in unit_stems(approval.plan)]
    report.say("systemctl reset-failed " + " ".join(services))
    try:
        systemd.reset_failed(services)
    except systemd.SystemdError as exc:
        report.say(f"(reset-failed: {exc.message}; nothing to reset for a unit not loaded)")
    enable = units_to_enable(approval)
    if enable:
        report.say("systemctl enable " + " ".join(enable))
        systemd.enable(enable)
    service = main_service(approval)
    timeout = start_wait_s(approval)
    waits = (
        "the first request starts the engine"
        if service.endswith(".socket")
        else ("waits for the health gate")
    )
    report.say(f"systemctl start {service} ({waits})")
    by = current_approver().describe()
    said = f"{name}: starting {service}, by {by}"
    emit(Event.START, name, said, identifier=EPYCCTL, reason=f"by {by}")
    systemd.start([service], timeout=timeout)
    report.done("started", f"{name} started: `epycctl status {name}`")


@click.command()
@click.argument("name")
@click.option("-n", "--lines", type=LOG_LINES, default=50, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="keep printing new lines")
def logs(name: str, lines: int, follow: bool) -> None:
    """The journal of endpoint NAME's unit (journalctl)."""
    from epycd.approval.record import readable_approval
    from epycd.approval.state import endpoint_unit_files
    from epycd.status.units import main_unit
    from epycd.systemd import SystemdError

    settings = checked_settings(name)
    approval = readable_approval(settings, name)
    has_file = (settings.config_dir / f"{name}.toml").is_file()
    if approval is None and not has_file and not endpoint_unit_files(settings, name):
        raise unknown_endpoint(settings, name)
    journalctl = shutil.which("journalctl")
    if journalctl is None:
        raise SystemdError("`journalctl` not found on PATH", fix="install systemd")
    argv = [journalctl, "--unit", main_unit(name, approval), "--lines", str(lines)]
    if follow:
        argv.append("--follow")
    os.execv(journalctl, argv)
