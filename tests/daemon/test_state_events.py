"""The daemon's journal events from the states it sees between refreshes
(epycd.status.changes.state_events), and how `Daemon.announce` sends them beside the
transition lines: each once, natively when stderr is the journal, else as lines."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cysystemd import journal

from epycd import events
from epycd.approval.crashloop import Failure
from epycd.daemon import Daemon
from epycd.events import MESSAGE_IDS, Event
from epycd.status.changes import Seen, StateEvent, seen, state_events
from epycd.status.instances import InstanceStatus
from epycd.status.machine import EndpointStatus
from tests.approval.conftest import make_env

KILLED = Failure(at=datetime.now(UTC), result="signal", how="signal KILL", reason="server exited")
WATCHDOG = Failure(at=datetime.now(UTC), result="watchdog", how="watchdog")


def endpoint(name: str, state: str, reason: str = "", **fields: Any) -> EndpointStatus:
    return EndpointStatus(name=name, state=state, reason=reason, unit=f"epyc-llm-{name}", **fields)


def member(number: int, state: str, restarts: int = 0, **fields: Any) -> InstanceStatus:
    return InstanceStatus(
        instance=number,
        unit=f"epyc-llm-pair_{number}.service",
        state=state,
        port=9000 + number,
        cpus=str(number),
        numa_nodes=[0],
        restarts=restarts,
        **fields,
    )


def run(steps: Sequence[Sequence[EndpointStatus]]) -> list[list[tuple[Any, ...]]]:
    """Each refresh's events, as (event, endpoint, instance, state, reason)."""
    previous: dict[str, Seen] = {}
    out = []
    for statuses in steps:
        found = state_events(previous, statuses)
        previous = seen(statuses)
        out.append([(e.event, e.endpoint, e.instance, e.state, e.reason) for e in found])
    return out


def test_an_endpoint_seen_first_says_nothing() -> None:
    assert run([[endpoint("a", "ready"), endpoint("b", "crash-loop", restarts=3)]]) == [[]]
    assert run([[endpoint("a", "starting")], [endpoint("a", "ready"), endpoint("b", "ready")]])[
        1
    ] == [(Event.READY, "a", None, "ready", None)]


def test_one_endpoint_through_its_life() -> None:
    drift = ["the plan changed since approval: max_num_seqs 8 -> 16", "x"]
    steps = [
        [endpoint("a", "starting", "unit activating")],
        [endpoint("a", "ready")],
        [endpoint("a", "starting", "unit activating", restarts=1, last_failure=KILLED)],
        [endpoint("a", "starting", "unit activating", restarts=1, last_failure=KILLED)],
        [endpoint("a", "ready", restarts=1, last_failure=KILLED)],
        [endpoint("a", "ready", "not healthy: /health timed out; systemd's...", restarts=1)],
        [endpoint("a", "ready", "not healthy: /health timed out; systemd's...", restarts=1)],
        [endpoint("a", "ready", restarts=2, last_failure=WATCHDOG)],
        [endpoint("a", "changed-needs-approval", reasons=drift, restarts=2)],
        [endpoint("a", "changed-needs-approval", reasons=drift, restarts=2)],
        [endpoint("a", "ready", restarts=1)],
        [endpoint("a", "stopped", "stopped by root")],
        [endpoint("a", "ready")],
        [endpoint("a", "failed:health", "gate", restarts=2)],
        [endpoint("a", "crash-loop", "crash loop since", restarts=3, last_failure=KILLED)],
        [endpoint("a", "approved", "installed, not started")],
    ]
    assert run(steps) == [
        [],
        [(Event.READY, "a", None, "ready", None)],
        [
            (Event.UNHEALTHY, "a", None, "starting", "unit activating"),
            (Event.RESTART, "a", None, "starting", "signal KILL: server exited"),
        ],
        [],
        [(Event.READY, "a", None, "ready", None)],
        [
            (
                Event.UNHEALTHY,
                "a",
                None,
                "ready",
                "not healthy: /health timed out; systemd's...",
            )
        ],
        [],
        [(Event.RESTART, "a", None, "ready", "watchdog")],
        [(Event.DRIFT, "a", None, "changed-needs-approval", "; ".join(drift))],
        [],
        [(Event.READY, "a", None, "ready", None)],  # the restarts fell: out of the interval
        [],  # stopped by the admin: not unhealthy
        [(Event.READY, "a", None, "ready", None)],
        [
            (Event.UNHEALTHY, "a", None, "failed:health", "gate"),
            (Event.RESTART, "a", None, "failed:health", None),
        ],
        [
            (Event.UNHEALTHY, "a", None, "crash-loop", "crash loop since"),
            (Event.RESTART, "a", None, "crash-loop", "signal KILL: server exited"),
        ],
        [],
    ]


def test_the_messages_say_what_the_lines_say() -> None:
    previous = seen([endpoint("a", "ready")])
    found = state_events(
        previous, [endpoint("a", "starting", "unit activating", restarts=2, last_failure=KILLED)]
    )
    assert [e.message for e in found] == [
        "a: ready -> starting: unit activating",
        "a: restarted by systemd (2 more failed runs); last failure: signal KILL: server exited",
    ]
    drift = state_events(previous, [endpoint("a", "changed-needs-approval", reasons=["p", "q"])])
    assert [e.message for e in drift] == ["a: changed since approval, not applied: p; q"]


def test_the_instances_of_a_set() -> None:
    def pair(state: str, restarts: int, *members: InstanceStatus, **kw: Any) -> EndpointStatus:
        return endpoint("pair", state, instances=list(members), restarts=restarts, **kw)

    steps = [
        [pair("ready", 0, member(1, "ready"), member(2, "ready"))],
        [
            pair(
                "degraded",
                1,
                member(1, "ready"),
                member(2, "starting", 1, reason="unit activating", last_failure=KILLED),
                reason="1 of 2 instances ready",
            )
        ],
        [pair("ready", 1, member(1, "ready"), member(2, "ready", 1))],
        [pair("ready", 2, member(1, "ready"), member(2, "ready", 1))],
        [pair("failed:instances", 2, member(1, "failed:health"), member(2, "crash-loop", 1))],
    ]
    assert run(steps) == [
        [],
        [
            (Event.UNHEALTHY, "pair", 2, "starting", "unit activating"),
            (Event.RESTART, "pair", 2, "starting", "signal KILL: server exited"),
        ],
        [
            (Event.READY, "pair", None, "ready", None),
            (Event.READY, "pair", 2, "ready", None),
        ],
        [(Event.RESTART, "pair", None, "ready", None)],  # the balancer's own
        [
            (Event.UNHEALTHY, "pair", None, "failed:instances", None),
            (Event.UNHEALTHY, "pair", 1, "failed:health", None),
            (Event.UNHEALTHY, "pair", 2, "crash-loop", None),
        ],
    ]


def test_gone_and_back_is_a_first_sight_again() -> None:
    steps = [[endpoint("a", "starting")], [], [endpoint("a", "ready")]]
    assert run(steps) == [[], [], []]


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    return Daemon(make_env(tmp_path, monkeypatch).settings)


LINES = ["a: ready -> starting: unit activating", "b: ready -> degraded: 1 of 2 instances ready"]
EVENTS = [
    StateEvent(Event.UNHEALTHY, "a", "a: ready -> starting", "starting", "unit activating"),
    StateEvent(Event.UNHEALTHY, "b", "b instance 2: ready -> starting", "starting", None, 2),
    StateEvent(Event.DRIFT, "c", "c: changed since approval, not applied: p", "x", "p"),
]


def test_announce_says_each_line_and_event_once(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="epycd"):
        daemon.announce(LINES, EVENTS)
    assert sorted(r.getMessage() for r in caplog.records) == sorted(
        [*LINES, "b instance 2: ready -> starting", "c: changed since approval, not applied: p"]
    )
    assert daemon.drifted == {"c"}


def test_announce_sends_events_natively_to_the_journal(
    daemon: Daemon, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(events, "journal_is_stderr", lambda: True)

    def send(**fields: Any) -> int:
        sent.append(fields)
        return 0

    monkeypatch.setattr(journal, "send", send)
    with caplog.at_level(logging.INFO, logger="epycd"):
        daemon.announce(LINES, EVENTS)
    assert [r.getMessage() for r in caplog.records] == [LINES[1]]  # no event: a plain line
    assert [(f["message"], f["message_id"], f.get("instance")) for f in sent] == [
        (LINES[0], MESSAGE_IDS[Event.UNHEALTHY], None),  # the transition line is its MESSAGE
        ("b instance 2: ready -> starting", MESSAGE_IDS[Event.UNHEALTHY], "2"),
        ("c: changed since approval, not applied: p", MESSAGE_IDS[Event.DRIFT], None),
    ]
    assert {f["syslog_identifier"] for f in sent} == {"epycd"}
    assert {f["endpoint"] for f in sent} == {"a", "b", "c"}


def test_reconcile_leaves_out_a_drift_line_its_event_said(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    daemon.statuses = [
        endpoint("c", "changed-needs-approval", reasons=["p"]),
        endpoint("d", "changed-needs-approval", reasons=["q"]),
    ]
    daemon.drifted = {"c"}
    with caplog.at_level(logging.INFO, logger="epycd"):
        daemon.reconcile()
    assert [r.getMessage() for r in caplog.records] == ["d: changed since approval, not applied: q"]
