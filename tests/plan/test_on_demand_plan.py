"""On-demand endpoints in the plan (docs/on-demand.md): the engine on a loopback port of its
own behind the endpoint's socket; a seat of its own while there is one, else a socket's swap
seat shared with the other on-demand endpoints there, one running at a time (`Conflicts=`);
the plain endpoints that never share; the units the real systemd-analyze accepts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from epycd import systemd
from epycd.approval.record import Approval, current_approver
from epycd.approval.state import EndpointState
from epycd.approval.workflow import (
    install_approval,
    main_service,
    make_approval,
    overlap,
    running_units,
)
from epycd.daemon import MANAGER_ENV, Daemon
from epycd.host.facts import HostFacts
from epycd.metrics.scrape import targets
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from epycd.plan.placement.ports import Listener
from epycd.plan.placement.reservations import Reservations
from epycd.status import collect
from epycd.status.collect import planned_map
from epycd.status.machine import EndpointStatus, endpoint_status
from epycd.status.units import UnitState
from epycd.supervisor import SupervisorStatus, write_status
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_llama_plan import LlamaWorkspace
from tests.render.realtools import quadlet_dryrun, verify, write_units

TWO_SOCKETS = "genoa-9654-2s-nps1"
"""Two sockets of one NUMA node each: two seats."""


@pytest.fixture
def lw(ws: PlanWorkspace, host_of: Callable[..., HostFacts]) -> LlamaWorkspace:
    return LlamaWorkspace(ws, host_of(TWO_SOCKETS))


def planned(results: dict[str, EndpointResult], name: str) -> Plan:
    plan = results[name].plan
    assert plan is not None, [e.text for e in results[name].errors]
    return plan


def unit_lines(text: str, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", text, re.MULTILINE)


def test_on_demand_endpoints_share_a_swap_seat_only_when_no_seat_is_left(
    lw: LlamaWorkspace,
) -> None:
    """A plain endpoint and three on-demand ones on two seats: the plain one and the first
    on-demand one each get a socket; the other two join the on-demand one's swap seat."""
    lw.endpoint("plain", "")
    for name in ("a", "b", "c"):
        lw.endpoint(
            name, 'on_demand = true\nidle_stop = "20s"\n' if name == "a" else "on_demand = true\n"
        )
    results = lw.plan()
    plain = planned(results, "plain").decisions
    assert plain.on_demand is None and plain.socket == 0
    group = {name: planned(results, name).decisions for name in ("a", "b", "c")}
    for name, decided in group.items():
        assert decided.on_demand is not None
        assert decided.socket == 1 and decided.on_demand.swap_group == ["a", "b", "c"], name
        assert "on demand, swaps with" in decided.socket_reason
    assert group["a"].on_demand is not None and group["a"].on_demand.idle_stop_s == 20
    assert group["b"].on_demand is not None and group["b"].on_demand.idle_stop_s == 15 * 60
    public = {d.port for d in (*group.values(), plain)}
    engines = {d.on_demand.engine_port for d in group.values() if d.on_demand is not None}
    assert len(public) == 4 and len(engines) == 3 and not public & engines
    for decided in group.values():
        assert decided.on_demand is not None
        assert decided.first.port == decided.on_demand.engine_port
        assert decided.first.host == "127.0.0.1"


def test_the_units_socket_proxy_and_engine(lw: LlamaWorkspace) -> None:
    lw.endpoint("plain", "")
    lw.endpoint("a", 'on_demand = true\nidle_stop = "20s"\nhost = "::1"\n')
    lw.endpoint("b", "on_demand = true\n")
    lw.endpoint("c", "on_demand = true\n")
    results = lw.plan()
    plan = planned(results, "b")
    engine_port = plan.decisions.on_demand.engine_port  # type: ignore[union-attr]
    assert sorted(plan.units) == [
        "epyc-llm-b.service",
        "epyc-llm-b.socket",
        "epyc-llm-b_proxy.service",
    ]
    assert set(plan.unit_dirs.values()) == {str(lw.ws.settings.unit_dir)}
    socket = plan.units["epyc-llm-b.socket"]
    assert unit_lines(socket, "ListenStream") == [f"127.0.0.1:{plan.decisions.port}"]
    assert unit_lines(socket, "Service") == ["epyc-llm-b_proxy.service"]
    assert unit_lines(socket, "WantedBy") == ["sockets.target"]
    proxy = plan.units["epyc-llm-b_proxy.service"]
    assert unit_lines(proxy, "Requires") == ["epyc-llm-b.service"]
    assert unit_lines(proxy, "ExecStart") == [
        f"/lib/systemd/systemd-socket-proxyd --exit-idle-time=900s 127.0.0.1:{engine_port}"
    ]
    engine = plan.units["epyc-llm-b.service"]
    assert unit_lines(engine, "StopWhenUnneeded") == ["yes"]
    assert unit_lines(engine, "KillMode") == ["mixed"]  # one stop signal, the supervisor's
    assert unit_lines(engine, "Conflicts") == ["epyc-llm-a.service epyc-llm-c.service"]
    # the stop of the other before this start: one direction per pair, no cycle
    assert "epyc-llm-c.service" in unit_lines(engine, "After")
    assert "epyc-llm-a.service" not in " ".join(unit_lines(engine, "After"))
    assert "[Install]" not in engine
    assert f"--port {engine_port}" in engine and "--host 127.0.0.1" in engine
    a = planned(results, "a")
    assert unit_lines(a.units["epyc-llm-a.socket"], "ListenStream") == [f"[::1]:{a.decisions.port}"]
    units = {name: text for p in (a, plan) for name, text in p.units.items()}
    verify(write_units(lw.ws.tmp / "units", units))


def test_with_a_seat_each_on_demand_endpoints_do_not_swap(lw: LlamaWorkspace) -> None:
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    results = lw.plan()
    for name in ("a", "b"):
        decided = planned(results, name).decisions
        assert decided.on_demand is not None and decided.on_demand.swap_group == [name]
        assert "Conflicts=" not in planned(results, name).units[f"epyc-llm-{name}.service"]
    assert {planned(results, n).decisions.socket for n in ("a", "b")} == {0, 1}


def test_a_plain_endpoint_never_shares_its_seat(lw: LlamaWorkspace) -> None:
    """Two plain endpoints hold both seats: an on-demand one has no swap seat to join, and
    is refused naming the key; the plain ones are planned as before."""
    lw.endpoint("p1", "")
    lw.endpoint("p2", "")
    lw.endpoint("od", "on_demand = true\n")
    results = lw.plan()
    assert results["od"].plan is None
    error = results["od"].errors[0]
    assert error.key == "socket" and "no socket or NUMA node left" in error.text, error.text
    assert {planned(results, n).decisions.socket for n in ("p1", "p2")} == {0, 1}


def test_an_approved_member_keeps_its_seat_and_engine_port(lw: LlamaWorkspace) -> None:
    """a and b approved in one swap seat beside a plain endpoint; a new on-demand endpoint
    joins them and moves neither, nor their engine ports; their units change (the group is
    approved as a whole), the plain one's do not."""
    lw.endpoint("plain", "")
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    first = lw.plan()
    approved = {name: planned(first, name) for name in ("plain", "a", "b")}
    lw.endpoint("aa", "on_demand = true\n")
    again = lw.plan(reservations=Reservations.of(approved))
    for name in ("a", "b"):
        before, after = approved[name].decisions, planned(again, name).decisions
        assert (after.socket, after.port) == (before.socket, before.port)
        assert after.on_demand is not None and before.on_demand is not None
        assert after.on_demand.engine_port == before.on_demand.engine_port
        assert after.on_demand.swap_group == ["a", "aa", "b"]
        # a new member is a change to approve: each member's units name it
        assert planned(again, name).fingerprint != approved[name].fingerprint
        assert "epyc-llm-aa.service" in planned(again, name).units[f"epyc-llm-{name}.service"]
    assert planned(again, "plain").fingerprint == approved["plain"].fingerprint
    joined = planned(again, "aa").decisions
    assert joined.socket == approved["a"].decisions.socket
    assert joined.on_demand is not None and joined.on_demand.engine_port not in {
        d.decisions.on_demand.engine_port for d in approved.values() if d.decisions.on_demand
    }


def approve_changed(
    lw: LlamaWorkspace, approved: dict[str, Plan], rounds: int
) -> tuple[dict[str, Plan], dict[str, EndpointResult], list[set[str]]]:
    """Plan with `approved` held, approve every planned endpoint whose plan changed, and
    again, `rounds` times: the approvals, the last plan, and what each round approved."""
    approved = dict(approved)
    changed: list[set[str]] = []
    results: dict[str, EndpointResult] = {}
    for _ in range(rounds):
        results = lw.plan(reservations=Reservations.of(approved))
        now = {
            name: plan
            for name, r in results.items()
            if (plan := r.plan) is not None
            and (name not in approved or plan.fingerprint != approved[name].fingerprint)
        }
        changed.append(set(now))
        approved |= now
    return approved, results, changed


@pytest.mark.parametrize("edited", ["a", "b"])
def test_a_swap_member_made_plain_with_no_seat_left_is_refused_and_the_other_keeps_its_seat(
    lw: LlamaWorkspace, edited: str
) -> None:
    """a and b approved in socket 1's swap seat beside a plain endpoint on socket 0; one of
    them edited into a plain endpoint, whichever it is: it is refused (a plain endpoint needs
    a seat of its own, none is left) naming the key and the fix, and the other member and
    the plain endpoint plan as approved, so nothing needs approving again."""
    lw.endpoint("plain", "")
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    first = lw.plan()
    approved = {name: planned(first, name) for name in ("plain", "a", "b")}
    path = lw.endpoint(edited, "")
    other = "b" if edited == "a" else "a"
    _, results, changed = approve_changed(lw, approved, rounds=2)
    assert changed == [set(), set()], changed
    refused = results[edited]
    assert refused.plan is None
    error = refused.errors[0]
    assert error.key == "socket" and error.file == str(path), error
    assert f"swap seat with {other}" in error.text, error.text
    assert error.fix is not None and "on_demand = true" in error.fix, error.fix
    kept = planned(results, other)
    assert kept.fingerprint == approved[other].fingerprint
    assert planned(results, "plain").fingerprint == approved["plain"].fingerprint


@pytest.mark.parametrize("edited", ["a", "b"])
def test_a_swap_member_made_plain_takes_a_free_seat_and_plan_approve_converge(
    lw: LlamaWorkspace, edited: str
) -> None:
    """a and b approved in one swap seat, the other socket freed since (its endpoint
    removed); one member edited into a plain endpoint moves to the free seat, the other
    keeps the swap seat (now its own), and one approve of each converges: planned again,
    nothing changes."""
    lw.endpoint("plain", "")
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    first = lw.plan()
    approved = {name: planned(first, name) for name in ("a", "b")}
    seat = approved["a"].decisions.socket
    (lw.ws.settings.config_dir / "plain.toml").unlink()
    lw.endpoint(edited, "")
    other = "b" if edited == "a" else "a"
    final, _results, changed = approve_changed(lw, approved, rounds=3)
    assert changed == [{"a", "b"}, set(), set()], changed
    moved, stayed = final[edited].decisions, final[other].decisions
    assert moved.on_demand is None and moved.socket != seat
    assert stayed.on_demand is not None and stayed.socket == seat
    assert stayed.on_demand.swap_group == [other]
    assert "Conflicts=" not in final[other].units[f"epyc-llm-{other}.service"]


def test_systemd_holding_an_approved_port_is_the_endpoint_itself(lw: LlamaWorkspace) -> None:
    """After approval the socket is PID 1's: planned again, the endpoint keeps its port
    (the same port held by another process is refused)."""
    path = lw.endpoint("a", "on_demand = true\nport = 8100\n")
    first = lw.plan()
    approved = {"a": planned(first, "a")}
    systemd = {8100: Listener(pid=1, process="systemd", endpoint=None)}
    again = lw.plan(reservations=Reservations.of(approved), listeners=systemd)
    assert planned(again, "a").fingerprint == approved["a"].fingerprint
    other = {8100: Listener(pid=4321, process="nginx", endpoint=None)}
    refused = lw.plan(listeners=other)["a"]
    assert refused.plan is None and "nginx" in refused.errors[0].text
    assert refused.errors[0].file == str(path) or str(path) in refused.errors[0].text


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("on_demand = true\ninstances = 2\n", "on_demand", "runs one engine"),
        ('idle_stop = "20s"\n', "idle_stop", "set on_demand = true"),
        ('on_demand = true\nidle_stop = "5s"\n', "idle_stop", "outside 10s-168h"),
        ('on_demand = true\nidle_stop = "15 min"\n', "idle_stop", "is not allowed"),
        ('on_demand = "yes"\n', "on_demand", "bool"),
    ],
)
def test_bad_on_demand_keys_are_refused_naming_the_key(
    lw: LlamaWorkspace, text: str, key: str, says: str
) -> None:
    lw.endpoint("bad", text)
    lw.endpoint("good", "")
    results = lw.plan()
    assert results["bad"].plan is None
    errors = {error.key: error for error in results["bad"].errors}
    assert key in errors and says in errors[key].text, [e.text for e in results["bad"].errors]
    assert planned(results, "good").decisions.on_demand is None


def test_a_plan_shows_the_swap_group_and_the_cold_cost(lw: LlamaWorkspace, tmp_path: Path) -> None:
    from epycd.cli.plan import confirmation_table, plan_json

    lw.endpoint("plain", "")
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    lw.endpoint("c", "on_demand = true\n")
    results = lw.plan()
    table = confirmation_table(results["b"], lw.host)
    assert "a, b, c share these cores and memory" in table and "stops a, c" in table, table
    assert "Cold request" in table and "On demand" in table, table
    assert "not measured here yet" in table, table
    decided = planned(results, "b").decisions
    assert decided.first.status_file is not None
    write_status(
        Path(decided.first.status_file),
        SupervisorStatus(
            state="stopped", name="b", url="u", model="b", ready_runs=4, ready_seconds=2.0
        ),
    )
    measured = confirmation_table(results["b"], lw.host)
    assert "measured here: 0.50 s a start, over its 4 since boot" in measured, measured
    data = plan_json(results["b"])
    decided = planned(results, "b").decisions
    assert data["port"] == decided.port and data["host"] == "127.0.0.1"
    assert data["on_demand"]["swap_group"] == ["a", "b", "c"], data["on_demand"]
    assert plan_json(results["plain"])["on_demand"] is None


def approved(lw: LlamaWorkspace, plan: Plan) -> Approval:
    return make_approval(
        lw.ws.settings, plan, lw.host, current_approver(), accepted_unvalidated=False
    )


def test_status_idle_and_what_approve_starts_and_stop_stops(lw: LlamaWorkspace) -> None:
    """Socket listening, engine inactive: idle, not a failure; the engine failed: failed as
    any endpoint; approve starts the socket, stop stops the socket, the proxy and the engine;
    two members of a swap group share their CPUs without an overlap."""
    lw.endpoint("plain", "")
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    results = lw.plan()
    approval = approved(lw, planned(results, "a"))
    state = EndpointState(endpoint="a", state="approved")
    listening = UnitState(unit="epyc-llm-a.socket", load="loaded", active="active")
    engine = UnitState(unit="epyc-llm-a.service", load="loaded", active="inactive")
    ready_runs = SupervisorStatus(
        state="stopped", name="a", url="u", model="a", ready_runs=3, ready_seconds=1.5
    )

    def status_of(unit: UnitState, socket: UnitState | None) -> EndpointStatus:
        return endpoint_status(
            state,
            approval=approval,
            current_plan=approval.plan,
            unit=unit,
            supervisor=ready_runs,
            stopped=None,
            socket=socket,
        )

    idle = status_of(engine, listening)
    assert idle.state == "idle" and "swaps with b" in idle.reason, idle
    assert idle.cold_starts is not None and idle.cold_starts.count == 3
    assert status_of(engine, listening.model_copy(update={"active": "inactive"})).state == (
        "approved"
    )
    failed = engine.model_copy(update={"active": "failed", "result": "exit-code"})
    assert status_of(failed, listening).state.startswith("failed")
    running = engine.model_copy(update={"active": "active"})
    assert status_of(running, listening).state == "ready"
    assert main_service(approval) == "epyc-llm-a.socket"
    assert running_units(approval) == ["epyc-llm-a_proxy.service", "epyc-llm-a.service"]
    b = planned(results, "b")
    plain = planned(results, "plain")
    assert overlap(b, approval.plan) == []
    assert overlap(plain, plain) != []
    assert running_units(approved(lw, plain)) == []


def test_the_daemon_starts_an_approved_on_demand_endpoint_by_its_socket_never_its_engine(
    lw: LlamaWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between `approve`'s install (the approval written, which epycd notices) and its
    `systemctl start` of the socket, an on-demand endpoint is approved with neither its socket
    nor its engine running. epycd starts what approve starts, the socket; a start of the
    engine is a start with no request (tests/e2e/test_llama.py's on-demand phase found an
    engine running, or failed, before any request)."""
    lw.endpoint("plain", "")
    lw.endpoint("a", "on_demand = true\n")
    lw.endpoint("b", "on_demand = true\n")
    results = lw.plan()
    for name in ("plain", "a"):
        install_approval(lw.ws.settings, approved(lw, planned(results, name)))

    def nothing_runs(units: list[str]) -> dict[str, UnitState]:
        return {unit: UnitState(unit=unit, load="loaded", active="inactive") for unit in units}

    started: list[tuple[str, ...]] = []

    def systemctl(*args: str, **_: object) -> str:
        started.append(args)
        return ""

    monkeypatch.setattr(collect, "read_unit_states", nothing_runs)
    monkeypatch.setattr(systemd, "systemctl", systemctl)
    for name in ("JOURNAL_STREAM", *MANAGER_ENV):
        monkeypatch.delenv(name, raising=False)
    daemon = Daemon(lw.ws.settings)
    daemon.planned = planned_map(list(results.values()))
    daemon.refresh()
    states = {status.name: status.state for status in daemon.statuses}
    assert states == {"a": "approved", "b": "pending-approval", "plain": "approved"}, states
    daemon.reconcile()
    assert sorted(started) == [
        ("start", "--no-block", "epyc-llm-a.socket"),
        ("start", "--no-block", "epyc-llm-plain.service"),
    ], started
    # nor does its /metrics scrape connect to the socket: it reads the engine's own port
    a = planned(results, "a").decisions
    assert a.on_demand is not None
    assert [urlsplit(t.url).port for t in targets([planned(results, "a")])] == [
        a.on_demand.engine_port
    ]


@pytest.mark.quadlet
def test_podman_on_demand_engines_pass_quadlet_and_verify(
    ws: PlanWorkspace, host_of: Callable[..., HostFacts], tmp_path: Path
) -> None:
    """vLLM in a Quadlet container on demand: the generated service stops when unneeded,
    conflicts with its swap group, starts at no target of its own, and stops with one
    signal to its main process (Quadlet's KillMode=mixed)."""
    host = host_of("genoa-9654-2s-nps1")
    ws.endpoint("plain", "")
    ws.endpoint("a", "on_demand = true\n")
    ws.endpoint("b", "on_demand = true\n")
    results = ws.plan(host)
    units: dict[str, str] = {}
    for name in ("a", "b"):
        plan = planned(results, name)
        assert plan.decisions.runtime == "podman"
        units.update(plan.units)
    folder = tmp_path / "quadlet"
    write_units(folder, {n: t for n, t in units.items() if n.endswith(".container")})
    containers = {n: t for n, t in units.items() if n.endswith(".container")}
    plain_units = {n: t for n, t in units.items() if not n.endswith(".container")}
    generated = quadlet_dryrun(folder)
    a = generated["epyc-llm-a.service"]
    assert unit_lines(a, "StopWhenUnneeded") == ["yes"]
    assert unit_lines(a, "Conflicts") == ["epyc-llm-b.service"]
    assert unit_lines(a, "KillMode") == ["mixed"]
    assert "WantedBy" not in a and len(containers) == 2
    services = {f"{name}": text for name, text in generated.items()} | plain_units
    verify(write_units(tmp_path / "verify", services))
