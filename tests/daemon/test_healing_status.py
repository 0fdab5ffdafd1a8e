"""Healing endpoints (docs/healing.md) through status, start and the daemon, from real files:
the real planner's plan (with its `healing`), the approval code, the real crash recorder and
boot check as subprocesses with systemd's variables, and the fake systemctl's unit states
(systemd is not PID 1 here; tests/e2e runs the real one): restarts and the last failure in
status, the crash-loop state, `epycctl start` clearing it, instance sets, and the daemon's one
journal line per transition."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from epycd.approval.crashloop import Failure, Verdict, crash_path
from epycd.daemon import transitions
from epycd.status.machine import EndpointStatus
from epycd.supervisor import SupervisorStatus, write_status
from tests.daemon.conftest import DaemonSandbox
from tests.daemon.test_daemon import daemon, stop_daemon

UNIT = "epyc-llm-chat.service"
BALANCER = "epyc-llm-pair.service"
INSTANCES = ("epyc-llm-pair_1.service", "epyc-llm-pair_2.service")
LOAD_ERROR = [
    "Traceback (most recent call last):",
    "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata",
]
WAIT = 90.0


def ended(
    ws: DaemonSandbox, name: str, unit: str, result: str = "exit-code", status: str = "1"
) -> subprocess.CompletedProcess[str]:
    """One run of `unit` ended, as systemd runs the unit's ExecStopPost=."""
    done = ws.epycctl(
        name,
        "--unit",
        unit.removesuffix(".service"),
        module="epycd.approval.crashloop",
        SERVICE_RESULT=result,
        EXIT_CODE="exited" if result == "exit-code" else "killed",
        EXIT_STATUS=status,
    )
    assert done.returncode == 0 and "failed:" not in done.stderr, done.stderr
    return done


def status_json(ws: DaemonSandbox, name: str) -> dict[str, Any]:
    done = ws.epycctl("status", name, "--json")
    assert done.returncode == 0, done.stderr
    entry: dict[str, Any] = json.loads(done.stdout)["endpoints"][0]
    return entry


@pytest.mark.vllm
def test_restarts_then_crash_loop_in_status_and_start_clears_it(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    approval = ws.approve("chat")
    healing = approval.plan.decisions.healing
    assert healing is not None and healing.start_limit_burst == 3, healing
    ws.set_unit(UNIT, "active")
    ws.supervisor_says("chat", "ready", phase="request")
    chat = status_json(ws, "chat")
    assert (chat["state"], chat["restarts"], chat["last_failure"]) == ("ready", 0, None)

    ws.supervisor_says("chat", "failed", phase="serving", reason="server exited with status -9")
    ended(ws, "chat", UNIT, "signal", "KILL")
    ws.set_unit(UNIT, "activating")
    ws.supervisor_says("chat", "starting", phase="health")
    chat = status_json(ws, "chat")
    assert chat["state"] == "starting" and chat["restarts"] == 1, chat
    assert chat["last_failure"]["how"] == "signal KILL"
    assert chat["last_failure"]["reason"] == (
        "failed in phase serving: server exited with status -9"
    )
    ws.set_unit(UNIT, "active")
    ws.supervisor_says("chat", "ready", phase="request")
    chat = status_json(ws, "chat")
    assert chat["state"] == "ready" and chat["restarts"] == 1, "a restart shows on a ready one"
    text = ws.epycctl("status", "chat")
    assert "restarts: 1" in text.stdout and "last failure " in text.stdout, text.stdout

    ws.supervisor_says(
        "chat", "failed", phase="health", reason="server exited while loading",
        first_error=LOAD_ERROR,
    )  # fmt: skip
    ended(ws, "chat", UNIT)
    looped = ended(ws, "chat", UNIT)
    assert "chat: crash loop: 3 runs failed within" in looped.stderr
    ws.set_unit(UNIT, "inactive")  # the restart was skipped by the approval check
    chat = status_json(ws, "chat")
    print(json.dumps(chat, indent=2))  # the status JSON of a crash-looped endpoint
    assert chat["state"] == "crash-loop", chat
    assert chat["restarts"] == 3
    assert chat["reason"].startswith("crash loop since ")
    assert chat["reason"].endswith("`epycctl start chat` to try again")
    assert "exit-code 1: failed in phase health: server exited while loading" in chat["reason"]
    loop = Verdict.model_validate(chat["crash_loop"])
    assert loop.failures == 3 and loop.first_error == LOAD_ERROR
    assert loop.interval_s == healing.start_limit_interval_s
    assert Failure.model_validate(chat["last_failure"]).first_error == LOAD_ERROR
    assert "handoff" not in chat or chat["handoff"] is None
    text = ws.epycctl("status", "chat")
    assert "crash-loop" in text.stdout and "first error of the last run:" in text.stdout
    assert LOAD_ERROR[1] in text.stdout
    everyone = json.loads(ws.epycctl("status", "--json").stdout)["endpoints"]
    assert [e["state"] for e in everyone] == ["crash-loop"]

    ws.epycctl("stop", "chat")
    assert status_json(ws, "chat")["state"] == "crash-loop", "it wins over stopped"
    refused = ws.epycctl("chat", module="epycd.approval.check")
    assert refused.returncode == 1, refused.stderr

    started = ws.epycctl("start", "chat")
    assert started.returncode == 0, started.stderr
    assert "cleared the crash loop of epyc-llm-chat" in started.stdout
    calls = ws.systemctl_calls()
    assert calls.index(f"reset-failed {UNIT}") < calls.index(f"start {UNIT}")
    assert not crash_path(ws.settings, "epyc-llm-chat").exists()
    assert ws.epycctl("chat", module="epycd.approval.check").returncode == 0
    chat = status_json(ws, "chat")
    assert chat["state"] == "ready" and chat["restarts"] == 0 and chat["crash_loop"] is None


@pytest.mark.vllm
def test_an_instance_in_a_crash_loop_and_a_set_with_none_ready(ws: DaemonSandbox) -> None:
    ws.endpoint("pair", "instances = 2\n")
    approval = ws.approve("pair")
    assert approval.plan.instance_set is not None
    members = approval.plan.decisions.members
    for unit in (BALANCER, *INSTANCES):
        ws.set_unit(unit, "active")
    second = members[1]
    assert second.status_file is not None
    write_status(
        Path(second.status_file),
        SupervisorStatus(
            state="failed", name="pair", url="http://127.0.0.1:1", model="m", phase="health",
            reason="server exited while loading", first_error=LOAD_ERROR,
        ),
    )  # fmt: skip
    for _ in range(3):
        ended(ws, "pair", INSTANCES[1])
    ws.set_unit(INSTANCES[1], "inactive")
    pair = status_json(ws, "pair")
    assert pair["state"] == "degraded", pair
    assert pair["reason"].startswith("1 of 2 instances ready"), pair["reason"]
    assert "2 (crash-loop)" in pair["reason"]
    assert [i["state"] for i in pair["instances"]] == ["ready", "crash-loop"]
    assert [i["restarts"] for i in pair["instances"]] == [0, 3]
    assert pair["instances"][1]["reason"].startswith("crash loop since ")
    assert pair["restarts"] == 3 and pair["crash_loop"] is None
    text = ws.epycctl("status", "pair").stdout
    assert f"instance 2 {INSTANCES[1]}: crash-loop" in text and "restarts 3" in text

    condition = f"{approval.plan.decisions.product_python} -m epycd.approval.check pair"
    assert (
        f"ExecCondition=+{condition} --unit epyc-llm-pair_2\n" in approval.plan.units[INSTANCES[1]]
    ), "the instance's own check names its unit"
    assert f"ExecCondition=+{condition}\n" in approval.plan.units[BALANCER]
    member = ws.epycctl("pair", "--unit", "epyc-llm-pair_2", module="epycd.approval.check")
    assert member.returncode == 1 and "crash loop since" in member.stderr
    other = ws.epycctl("pair", "--unit", "epyc-llm-pair_1", module="epycd.approval.check")
    assert other.returncode == 0, other.stderr
    assert ws.epycctl("pair", module="epycd.approval.check").returncode == 0, "the balancer"

    ws.set_unit(INSTANCES[0], "failed", "exit-code")
    pair = status_json(ws, "pair")
    assert pair["state"] == "failed:instances", pair
    assert pair["reason"].startswith(
        "0 of 2 instances ready, fewer than min_ready = 2: the balancer has nothing to send"
    )

    started = ws.epycctl("start", "pair")
    assert started.returncode == 0, started.stderr
    assert "cleared the crash loop of epyc-llm-pair_2" in started.stdout
    assert f"reset-failed {BALANCER} {INSTANCES[0]} {INSTANCES[1]}" in ws.systemctl_calls()
    assert not crash_path(ws.settings, "epyc-llm-pair_2").exists()


def endpoint(name: str, state: str, reason: str = "", **fields: Any) -> EndpointStatus:
    return EndpointStatus(name=name, state=state, reason=reason, unit=f"epyc-llm-{name}", **fields)


def test_transitions_say_each_change_once() -> None:
    previous: dict[str, str] = {}
    left: set[str] = set()
    failure = Failure(
        at=datetime.now(UTC), result="signal", how="signal KILL", reason="server exited"
    )
    steps = [
        ([endpoint("a", "ready"), endpoint("b", "starting")], []),
        ([endpoint("a", "ready"), endpoint("b", "ready")], []),
        (
            [endpoint("a", "starting", "unit activating", last_failure=failure),
             endpoint("b", "ready")],
            ["a: ready -> starting: unit activating (last failure: signal KILL: server exited)"],
        ),
        ([endpoint("a", "starting", "unit activating"), endpoint("b", "ready")], []),
        ([endpoint("a", "ready"), endpoint("b", "degraded", "1 of 2 instances ready")],
         ["a: starting -> ready", "b: ready -> degraded: 1 of 2 instances ready"]),
        ([endpoint("a", "failed:health", "x"), endpoint("b", "failed:instances", "0 of 2")],
         ["a: ready -> failed:health: x", "b: degraded -> failed:instances: 0 of 2"]),
        ([endpoint("a", "crash-loop", "crash loop since"), endpoint("b", "failed:instances")],
         ["a: failed:health -> crash-loop: crash loop since"]),
        ([endpoint("a", "approved"), endpoint("b", "ready")], ["b: failed:instances -> ready"]),
        ([endpoint("a", "starting")], []),
    ]  # fmt: skip
    for statuses, lines in steps:
        assert transitions(previous, statuses, left) == lines, statuses
    assert previous == {"a": "starting"} and left == {"a"}


@pytest.mark.vllm
def test_the_daemon_logs_a_ready_endpoint_leaving_once(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(UNIT, "active")
    ws.supervisor_says("chat", "ready", phase="request")
    with daemon(ws) as (process, sock):
        assert sock.wait_for("READY=1", WAIT) is not None
        ws.supervisor_says("chat", "failed", phase="serving", reason="server exited")
        ended(ws, "chat", UNIT, "signal", "KILL")
        ws.set_unit(UNIT, "activating")
        assert sock.wait_for("STATUS=1 starting", WAIT) is not None
        sock.wait_for("never", 2.0)  # a few more refreshes (every 0.5 s) in the same state
        ws.set_unit(UNIT, "active")
        assert sock.wait_for("STATUS=1 ready", WAIT) is not None
        stop_daemon(process, sock)
        assert process.stdout is not None
        out = process.stdout.read()
    left = [line for line in out.splitlines() if line.startswith("chat: ready -> ")]
    assert left == [
        "chat: ready -> starting: unit activating (activating) "
        "(last failure: signal KILL: failed in phase serving: server exited)"
    ], out
    assert out.count("chat: starting -> ready") == 1, out


def test_an_on_demand_endpoints_cycle_says_nothing_but_a_failure_is_said() -> None:
    """idle -> starting (a request) -> ready -> idle (its idle time) is an on-demand
    endpoint's life (docs/on-demand.md); a failure out of idle is said, and ready again after
    it too."""
    previous: dict[str, str] = {}
    left: set[str] = set()
    steps = [
        ("idle", []),
        ("starting", []),
        ("ready", []),
        ("idle", []),
        ("ready", []),
        ("idle", []),
        ("failed:start", ["od: idle -> failed:start: x"]),
        ("ready", ["od: failed:start -> ready"]),
    ]
    for state, lines in steps:
        status = endpoint("od", state, "x" if state.startswith("failed") else "")
        assert transitions(previous, [status], left) == lines, state
