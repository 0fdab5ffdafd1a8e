"""`epycd`: keeps the approved endpoints running as approved, and says how they stand.

At start (and on SIGHUP, and when the endpoint files, approvals or stop markers change) it
plans every endpoint file, compares with the approvals, and starts the installed units of
endpoints that are approved, unchanged and not stopped by the admin (an on-demand endpoint's
socket, never its engine: docs/on-demand.md). It never writes a
unit: only `epycctl approve` does. Drift is reported, not applied. Failed units are not
restarted (no retry loops). It tells systemd READY=1 once every endpoint it waits for is
ready or has failed, with STATUS= counts, and keeps `RUN_DIR/status.json` current. When an
endpoint leaves ready (or degraded), enters a crash loop, or comes back to ready after that,
it logs one line: the endpoint, old -> new state and the reason (`transitions`). Beside
them, the journal events of epycd.events (`state_events`): ready, unhealthy, restart and
drift, per endpoint and per instance of a set, with their MESSAGE_IDs.

It serves Prometheus metrics at `metrics_listen` (`epycd.metrics`, from its own thread:
each scrape reads the latest status and the instances' own /metrics then), and at each
refresh reads the serving instances' /metrics for the last minute of load that
`epycctl status NAME` shows.

One thread. It sleeps on an Event that the signal handlers set, with timeouts: the config
folder is polled by its names, sizes and mtimes (cheap stat calls), the units' states by one
`systemctl show` per refresh. The endpoints are their own units: SIGTERM stops only this
daemon. Its own process stays off the endpoints' cores when the host has other cores.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import click

from epycd.approval.crashloop import failure_text
from epycd.cli.options import FiniteFloatRange
from epycd.errors import EpycError
from epycd.events import Event, OneLineFormatter, log_event
from epycd.metrics.gateway import usage_url
from epycd.metrics.load import LoadWindow
from epycd.metrics.server import MetricsServer
from epycd.notify import Notifier
from epycd.paths import DAEMON_STATUS_FILE
from epycd.plan.endpoint import Plan
from epycd.settings import Settings, load_settings
from epycd.status.changes import EVENT_LEVELS, Seen, StateEvent, seen, state_events
from epycd.status.machine import AVAILABLE, IDLE, SERVING, EndpointStatus
from epycd.status.units import STARTING_UNIT_STATES
from epycd.text import escaped

log = logging.getLogger("epycd")


POLL_SECONDS = 3.0
REFRESH_SECONDS = 10.0
SETTLE_POLL_SECONDS = 2.0
START_JOB_GRACE_SECONDS = 15.0
SETTLE_MARGIN_SECONDS = 60.0
SETTLE_CAP_SECONDS = 25 * 60.0
"""The wait before READY=1 stays under epycd.service's TimeoutStartSec=30min."""
SETTLE_FLOOR_SECONDS = 600
"""The least the daemon waits for endpoints to settle, however short their start timeouts."""
MANAGER_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""Kept from children (podman, systemctl, the vLLM probe): only epycd talks to systemd."""
Snapshot = frozenset[tuple[str, int, int]]


def folder_snapshot(folder: Path, suffixes: Sequence[str]) -> set[tuple[str, int, int]]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return set()
    found = set()
    for entry in entries:
        if entry.name.endswith(tuple(suffixes)) and not entry.name.startswith("."):
            try:
                stat = entry.stat()
            except OSError:
                continue
            found.add((entry.path, stat.st_mtime_ns, stat.st_size))
    return found


def inputs_snapshot(settings: Settings) -> Snapshot:
    """Names, mtimes and sizes of what changes the answer: endpoint files, epycd.conf,
    approvals and stop markers. A few stat calls: cheap enough to poll every few seconds."""
    from epycd.approval.record import approvals_dir
    from epycd.status.stop import stop_markers_dir

    return frozenset(
        folder_snapshot(settings.config_dir, (".toml", ".conf"))
        | folder_snapshot(approvals_dir(settings), (".json",))
        | folder_snapshot(stop_markers_dir(settings), (".json",))
    )


def endpoint_cpus(plans: Iterable[Plan], siblings: dict[int, list[int]]) -> set[int]:
    """Every CPU an endpoint is pinned to, with the SMT siblings of its cores."""
    from epycd.host.cpulist import parse_cpulist

    cpus: set[int] = set()
    for plan in plans:
        for cpu in parse_cpulist(plan.decisions.cpus):
            cpus.add(cpu)
            cpus.update(siblings.get(cpu, []))
    return cpus


def spare_cpus(allowed: set[int], taken: set[int]) -> set[int]:
    """The daemon's CPUs: those the endpoints do not use, or all when none are left."""
    return (allowed - taken) or allowed


def on_demand_cycle(old: str, new: str) -> bool:
    """An on-demand endpoint's life, nothing an admin must hear of: idle, starting on a
    request, ready, idle again."""
    return IDLE in (old, new) and {old, new} <= AVAILABLE | {"starting"}


def transitions(
    previous: dict[str, str], statuses: Sequence[EndpointStatus], left: set[str]
) -> list[str]:
    """One line per endpoint whose state changed in a way an admin must hear of: it left a
    serving state, went into a crash loop, or is ready again after either. `previous`
    (name -> state) and `left` (the names that left serving) are updated in place; an
    endpoint seen for the first time says nothing."""
    lines = []
    for status in statuses:
        old, new = previous.get(status.name), status.state
        previous[status.name] = new
        if old is None or old == new or on_demand_cycle(old, new):
            continue
        back = new == "ready" and status.name in left
        if old not in AVAILABLE and new != "crash-loop" and not back:
            continue
        if back:
            left.discard(status.name)
        elif new not in SERVING or old == "ready":
            left.add(status.name)
        line = f"{status.name}: {old} -> {new}"
        if status.reason:
            line += f": {status.reason}"
        failure = status.last_failure
        if failure is not None and new not in SERVING and new != "crash-loop":
            line += f" (last failure: {failure_text(failure)})"
        lines.append(line)
    names = {status.name for status in statuses}
    for name in [name for name in previous if name not in names]:
        del previous[name]
        left.discard(name)
    return lines


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


@dataclass
class Waiting:
    """Endpoints the daemon waits for before READY=1 (or the next READY after reload): also
    a changed or stopped endpoint whose approved unit systemd is starting (enabled at boot)."""

    started: dict[str, float] = field(default_factory=dict)
    deadline: float = 0.0

    def pending(self, statuses: Sequence[EndpointStatus], now: float) -> list[str]:
        names = []
        for status in statuses:
            if (
                status.kind == "starting"
                or status.unit_state in STARTING_UNIT_STATES
                or (
                    status.state == "approved"
                    and now - self.started.get(status.name, -1e9) < START_JOB_GRACE_SECONDS
                )
            ):
                names.append(status.name)
        return names


class Daemon:
    def __init__(
        self,
        settings: Settings,
        *,
        poll_seconds: float = POLL_SECONDS,
        refresh_seconds: float = REFRESH_SECONDS,
        settle_seconds: float | None = None,
    ) -> None:
        self.settings = settings
        self.poll_seconds = poll_seconds
        self.refresh_seconds = refresh_seconds
        self.settle_seconds = settle_seconds
        self.notifier = Notifier()
        for name in MANAGER_ENV:
            os.environ.pop(name, None)
        self.wake = threading.Event()
        self.stop_requested = False
        self.reload_requested = False
        self.allowed_cpus = set(os.sched_getaffinity(0))
        self.snapshot: Snapshot = frozenset()
        self.planned: dict[str, Any] = {}
        self.statuses: list[EndpointStatus] = []
        self.siblings: dict[int, list[int]] = {}
        self.waiting = Waiting()
        self.phase = "starting"
        self.written: dict[str, Any] | None = None
        self.last_status_line = ""
        self.states: dict[str, str] = {}
        self.left_serving: set[str] = set()
        self.approved: dict[str, Plan] = {}
        self.loads = LoadWindow()
        self.metrics = MetricsServer(self.metrics_source, gateway=self.gateway_usage_url)
        self.seen: dict[str, Seen] = {}
        self.drifted: set[str] = set()

    # --- signals ---------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self.reload_requested = True
        else:
            self.stop_requested = True
        self.wake.set()

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self.on_signal)

    def sleep(self, seconds: float) -> None:
        self.wake.wait(seconds)
        self.wake.clear()

    @property
    def interrupted(self) -> bool:
        return self.stop_requested or self.reload_requested

    # --- the work ----------------------------------------------------------------------

    def plan(self) -> None:
        """Plan every endpoint file; on failure keep the last answer and say why."""
        from epycd.approval.record import approved_plans
        from epycd.plan.pipeline.current import plan_endpoints
        from epycd.render import render_for_plan
        from epycd.status.collect import planned_map

        self.snapshot = inputs_snapshot(self.settings)
        try:
            results, host = plan_endpoints(
                self.settings, approved_plans(self.settings), render=render_for_plan
            )
        except EpycError as exc:
            log.error("planning failed: %s", exc)
            return
        except Exception:
            log.exception("planning failed")
            return
        self.planned = dict(planned_map(results))
        self.siblings = {
            cpu: list(others)
            for sock in host.socket_topology
            for cpu, others in sock.smt_siblings.items()
        }
        for result in results:
            for problem in result.errors:
                log.warning("%s: %s", result.endpoint, problem.text)

    def refresh(self) -> None:
        from epycd.status.collect import collect_status

        try:
            statuses = collect_status(self.settings, self.planned)
        except EpycError as exc:
            log.error("status: %s", exc)
            return
        self.read_load(statuses)
        self.statuses = statuses
        lines = transitions(self.states, self.statuses, self.left_serving)
        events = state_events(self.seen, self.statuses)
        self.seen = seen(self.statuses)
        self.announce(lines, events)

    def announce(self, lines: Sequence[str], events: Sequence[StateEvent]) -> None:
        """The transition lines and the events, each once: an endpoint's ready or unhealthy
        event carries its transition line as its MESSAGE (the line `journalctl -u epycd`
        showed before events), the other lines are logged as they were."""
        said = {line.split(": ", 1)[0]: line for line in lines}
        self.drifted = set()
        for event in events:
            message = event.message
            if event.instance is None and event.event in {Event.READY, Event.UNHEALTHY}:
                message = said.pop(event.endpoint, message)
            if event.event is Event.DRIFT:
                self.drifted.add(event.endpoint)
            log_event(
                log,
                EVENT_LEVELS.get(event.event, logging.INFO),
                event.event,
                event.endpoint,
                message,
                instance=event.instance,
                state=event.state,
                reason=event.reason,
            )
        for line in lines:
            if line in said.values():
                log.warning("%s", line)

    def read_load(self, statuses: Sequence[EndpointStatus]) -> None:
        """The serving instances' load, added to the window and to `statuses` before they
        replace the daemon's (a scrape reads those from its own thread)."""
        from epycd.metrics.scrape import read_all, targets

        serving = [
            self.approved[status.name]
            for status in statuses
            if status.state in SERVING and status.name in self.approved
        ]
        self.loads.add(read_all(targets(serving)), time.monotonic())
        for status in statuses:
            status.load = self.loads.loads(status.name) if status.state in SERVING else []

    def metrics_source(self) -> tuple[list[EndpointStatus], dict[str, Plan]]:
        """What a scrape reads: both are replaced whole by the daemon's thread, never changed
        in place."""
        return self.statuses, self.approved

    def gateway_usage_url(self) -> str | None:
        return usage_url(self.settings)

    def approved_plans(self) -> list[Plan]:
        """The approved plans that can be read (a broken record is reported by status)."""
        from epycd.approval.record import approved_names, load_approval

        plans = []
        for name in approved_names(self.settings):
            try:
                approval = load_approval(self.settings, name)
            except EpycError as exc:
                log.error("%s", exc)
                continue
            if approval is not None:
                plans.append(approval.plan)
        return plans

    def pin_self(self) -> None:
        plans = list(self.approved.values())
        plans += [p for p in self.planned.values() if isinstance(p, Plan)]
        cpus = spare_cpus(self.allowed_cpus, endpoint_cpus(plans, self.siblings))
        if cpus != set(os.sched_getaffinity(0)):
            os.sched_setaffinity(0, cpus)
            log.info("running on CPUs %s, off the endpoints' cores", sorted(cpus))

    def reconcile(self) -> None:
        """Start the installed units of approved, unchanged, not stopped endpoints that are
        not running: the unit `approve` starts (`main_service`), which for an on-demand
        endpoint is its socket, never its engine (only a request starts that). Failed units
        stay failed: no retry."""
        from epycd import systemd
        from epycd.approval.record import readable_approval
        from epycd.approval.workflow import main_service

        now = time.monotonic()
        for status in self.statuses:
            if status.state != "approved" or status.unit_state != "inactive":
                continue
            approval = readable_approval(self.settings, status.name)
            if approval is None:
                continue  # gone or damaged since the status: the next load says which
            unit = main_service(approval)
            log_event(
                log,
                logging.INFO,
                Event.START,
                status.name,
                f"{status.name}: approved and installed, not running: starting {unit}",
                state=status.state,
                reason=status.reason or None,
            )
            try:
                systemd.systemctl("start", "--no-block", unit)
            except systemd.SystemdError as exc:
                log.error("%s: %s", status.name, exc)
                continue
            self.waiting.started[status.name] = now
        for status in self.statuses:
            if status.state == "damaged":
                log.error("%s: %s", status.name, status.reason)
            if status.state == "changed-needs-approval" and status.name not in self.drifted:
                log.warning(
                    "%s: changed since approval, not applied: %s",
                    status.name,
                    "; ".join(status.reasons),
                )

    def start_timeout(self) -> float:
        if self.settle_seconds is not None:
            return self.settle_seconds
        longest = SETTLE_FLOOR_SECONDS
        for plan in self.approved.values():
            longest = max(longest, plan.decisions.start_timeout_s)
        return min(longest + SETTLE_MARGIN_SECONDS, SETTLE_CAP_SECONDS)

    def load(self) -> None:
        """Plan, refresh, pin, reconcile: what happens at start, on SIGHUP and on change."""
        self.plan()
        self.approved = {plan.decisions.endpoint: plan for plan in self.approved_plans()}
        self.refresh()
        self.pin_self()
        self.reconcile()
        self.refresh()
        self.waiting.deadline = time.monotonic() + self.start_timeout()
        self.publish()

    def settle(self) -> None:
        """Sleep until every endpoint being started is ready or failed (bounded)."""
        while not self.interrupted:
            now = time.monotonic()
            pending = self.waiting.pending(self.statuses, now)
            if not pending:
                return
            if now >= self.waiting.deadline:
                log.warning("still starting after the wait bound: %s", ", ".join(pending))
                return
            self.publish(waiting=pending)
            self.sleep(SETTLE_POLL_SECONDS)
            self.refresh()

    # --- what others see -----------------------------------------------------------------

    def status_line(self, waiting: Sequence[str] = ()) -> str:
        from epycd.status.machine import counts_text

        text = counts_text(self.statuses)
        if waiting:
            text += "; waiting for " + ", ".join(waiting)
        return text

    def publish(self, waiting: Sequence[str] = ()) -> None:
        line = self.status_line(waiting)
        self.write_status_file(line)
        if line != self.last_status_line:
            self.notifier.status(line)
            self.last_status_line = line
            log.info("%s", line)

    def write_status_file(self, line: str) -> None:
        from epycd.atomic import write_atomic
        from epycd.status.machine import status_json

        content = {
            "daemon": {"pid": os.getpid(), "state": self.phase, "summary": line},
            **status_json(self.statuses),
        }
        if content == self.written:
            return
        data = {"updated": datetime.now(UTC).isoformat(timespec="seconds"), **content}
        path = self.settings.run_dir / DAEMON_STATUS_FILE
        try:
            write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
        except OSError as exc:
            log.error("cannot write %s: %s", path, exc)
            return
        self.written = content

    def ready(self) -> None:
        self.phase = "ready"
        self.write_status_file(self.status_line())
        self.last_status_line = self.status_line()
        self.notifier.send("READY=1", f"STATUS={self.last_status_line}")
        log.info("ready: %s", self.last_status_line)

    # --- the loop ------------------------------------------------------------------------

    def do_reload(self) -> None:
        self.reload_requested = False
        self.phase = "reloading"
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}", "STATUS=reloading")
        log.info("reloading (SIGHUP)")
        try:
            self.settings = load_settings()
        except EpycError as exc:
            log.error("keeping the previous settings: %s", exc)
        self.metrics.apply(self.settings.metrics_listen)
        self.load()
        self.settle()
        if not self.stop_requested:
            self.ready()

    def run(self) -> int:
        self.install_signals()
        self.notifier.status("planning the endpoints")
        self.recover()
        # the first scrape, before the first plan and status, has the approved endpoints
        self.approved = {plan.decisions.endpoint: plan for plan in self.approved_plans()}
        self.metrics.apply(self.settings.metrics_listen)
        self.load()
        self.settle()
        if not self.stop_requested:
            self.ready()
        last_refresh = time.monotonic()
        while not self.stop_requested:
            if self.reload_requested:
                self.do_reload()
                last_refresh = time.monotonic()
                continue
            if inputs_snapshot(self.settings) != self.snapshot:
                log.info("endpoint files, approvals or stop markers changed: planning again")
                self.load()
                self.settle()
                self.publish()
                last_refresh = time.monotonic()
            elif time.monotonic() - last_refresh >= self.refresh_seconds:
                self.refresh()
                self.publish()
                last_refresh = time.monotonic()
            self.sleep(self.poll_seconds)
        self.notifier.stopping("stopping epycd; the endpoints keep running")
        self.metrics.stop()
        log.info("stopping; the endpoints are their own units and keep running")
        return 0

    def recover(self) -> None:
        from epycd.approval.workflow import recover_interrupted

        try:
            for line in recover_interrupted(self.settings):
                log.info("recovery: %s", line)
        except EpycError as exc:
            log.error("could not finish interrupted installs: %s", exc)


def log_to_stderr() -> None:
    """Every line the daemon logs goes to stderr (the journal under systemd, one entry per
    line) through `OneLineFormatter`: the one place its lines leave, so a model file's or an
    endpoint file's text in any of them (a refusal, a transition's reason) stays one line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--poll-interval",
    type=FiniteFloatRange(min=0.1, max=3600),
    default=POLL_SECONDS,
    show_default=True,
    help="seconds between looks at the endpoint files, approvals and stop markers",
)
@click.option(
    "--refresh-interval",
    type=FiniteFloatRange(min=0.1, max=86400),
    default=REFRESH_SECONDS,
    show_default=True,
    help="seconds between asking systemd how the endpoint units stand",
)
@click.option(
    "--settle-timeout",
    type=FiniteFloatRange(min=0, max=86400),
    default=None,
    help="seconds to wait for starting endpoints before READY=1 "
    "(default: the longest start timeout of the approved plans + 60)",
)
def main(poll_interval: float, refresh_interval: float, settle_timeout: float | None) -> None:
    """The epyc-llm daemon (run by systemd as epycd.service)."""
    log_to_stderr()
    try:
        settings = load_settings()
    except EpycError as exc:
        click.echo(escaped(f"epycd: {exc}"), err=True)
        sys.exit(exc.exit_code)
    daemon = Daemon(
        settings,
        poll_seconds=poll_interval,
        refresh_seconds=refresh_interval,
        settle_seconds=settle_timeout,
    )
    sys.exit(daemon.run())


if __name__ == "__main__":
    main()
