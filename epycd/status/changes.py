"""The journal events (epycd.events) the daemon sends from the state changes it sees
between two refreshes (`state_events`): ready, unhealthy, restart and drift, for an endpoint
and for each instance of a multi-instance endpoint. Pure: the daemon keeps `seen` of the
last refresh and logs what this returns (`epycd.daemon.Daemon.announce`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from epycd.approval.crashloop import Failure, failure_text
from epycd.events import Event
from epycd.status.machine import NOT_HEALTHY, SERVING, EndpointStatus

UNHEALTHY_KINDS = frozenset({"starting", "failed", "approved", "crash-loop"})
"""Not serving, and not by the admin's doing (stopped, removed, changed): `unhealthy`."""
EVENT_LEVELS = {
    Event.UNHEALTHY: logging.WARNING,
    Event.RESTART: logging.WARNING,
    Event.DRIFT: logging.WARNING,
}
"""The level of the line logged when stderr is not the journal; the others are INFO."""


@dataclass(frozen=True)
class Seen:
    """An endpoint at the last refresh, as `state_events` compares it: its state, its own
    restarts (a set's balancer: the instances count their own), whether its supervisor said
    it is not healthy, and each instance's (state, restarts)."""

    state: str
    restarts: int
    unhealthy: bool
    instances: Mapping[int, tuple[str, int]] = field(default_factory=dict)


def seen(statuses: Sequence[EndpointStatus]) -> dict[str, Seen]:
    return {
        status.name: Seen(
            state=status.state,
            restarts=status.restarts - sum(i.restarts for i in status.instances),
            unhealthy=status.reason.startswith(NOT_HEALTHY),
            instances={i.instance: (i.state, i.restarts) for i in status.instances},
        )
        for status in statuses
    }


@dataclass(frozen=True)
class StateEvent:
    """One journal event the daemon sends (epycd.events)."""

    event: Event
    endpoint: str
    message: str
    state: str
    reason: str | None = None
    instance: int | None = None


def _kind(state: str) -> str:
    return state.split(":", 1)[0]


def _changed(
    name: str, old: str, new: str, reason: str, instance: int | None = None
) -> list[StateEvent]:
    """ready or unhealthy, for an endpoint or an instance that went from `old` to `new`."""
    who = name if instance is None else f"{name} instance {instance}"
    line = f"{who}: {old} -> {new}" + (f": {reason}" if reason else "")
    if new == "ready" and old != "ready":
        return [StateEvent(Event.READY, name, line, new, reason or None, instance)]
    unhealthy = _kind(new) in UNHEALTHY_KINDS and (
        old in SERVING or (new == "crash-loop" and old != new)
    )
    if unhealthy:
        return [StateEvent(Event.UNHEALTHY, name, line, new, reason or None, instance)]
    return []


def _restarted(
    name: str, state: str, grew: int, failure: Failure | None, instance: int | None = None
) -> list[StateEvent]:
    if grew <= 0:
        return []
    who = name if instance is None else f"{name} instance {instance}"
    line = f"{who}: restarted by systemd ({grew} more failed run{'s' if grew > 1 else ''})"
    reason = failure_text(failure) if failure is not None else None
    if reason:
        line += f"; last failure: {reason}"
    return [StateEvent(Event.RESTART, name, line, state, reason, instance)]


def state_events(
    previous: Mapping[str, Seen], statuses: Sequence[EndpointStatus]
) -> list[StateEvent]:
    """The journal events between two refreshes. An endpoint (or instance) seen for the
    first time says nothing: the daemon starting finds it ready, no event. Pure.

    ready: it enters ready from another state; unhealthy: it leaves ready or degraded for a
    state that does not serve (starting, failed, approved: the unit is down) or enters a
    crash loop, or its supervisor says it is not healthy; restart: its failed runs within
    the start limit interval grew (systemd restarted it); drift: it enters
    changed-needs-approval."""
    events: list[StateEvent] = []
    now = seen(statuses)
    for status in statuses:
        old, new = previous.get(status.name), now[status.name]
        if old is None:
            continue
        name, state = status.name, status.state
        if old.state != state:
            events += _changed(name, old.state, state, status.reason)
        if new.unhealthy and not old.unhealthy and old.state == state:
            line = f"{name}: {status.reason}"
            events.append(StateEvent(Event.UNHEALTHY, name, line, state, status.reason))
        if state == "changed-needs-approval" and old.state != state:
            reasons = "; ".join(status.reasons)
            line = f"{name}: changed since approval, not applied: {reasons}"
            events.append(StateEvent(Event.DRIFT, name, line, state, reasons or None))
        own_failure = status.last_failure if not status.instances else None
        events += _restarted(name, state, new.restarts - old.restarts, own_failure)
        for instance in status.instances:
            if instance.instance not in old.instances:
                continue
            was, restarts = old.instances[instance.instance]
            number = instance.instance
            if was != instance.state:
                events += _changed(name, was, instance.state, instance.reason, number)
            grew = instance.restarts - restarts
            events += _restarted(name, instance.state, grew, instance.last_failure, number)
    return events
