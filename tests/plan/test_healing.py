"""How an endpoint's units come back by themselves (docs/healing.md): the figures of `Healing`
from its inputs, and the healing the real planner gives every path, each instance of a set and
the set's balancer."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from epycd.host.facts import DockerFacts, HostFacts, HostVllmFacts, RuntimeFacts
from epycd.plan.endpoint import Plan
from epycd.plan.healing import Healing, balancer_healing, balancer_start_s, healing_for
from tests.plan.conftest import PlanWorkspace

HostOf = Callable[..., HostFacts]
DOCKER = RuntimeFacts(docker=DockerFacts(present=True, version="28.2.2", daemon_reachable=True))
HOST_VLLM = 'runtime = "host"\nvllm = "/opt/zen/bin/vllm"\n'


def zen(executable: str) -> HostVllmFacts:
    return HostVllmFacts(path=executable, present=True, version="0.32.0", platform="ZenCpuPlatform")


def _plan(ws: PlanWorkspace, host: HostFacts, text: str, name: str = "llm") -> Plan:
    ws.endpoint(name, text)
    result = ws.plan(host, probe=zen)[name]
    assert result.plan is not None, [e.text for e in result.errors]
    return result.plan


@pytest.mark.parametrize(
    ("start_s", "supervised", "interval_s", "watchdog_s"),
    [
        (360, True, 1155, 30),  # 3 x (360 + 5) + 60
        (750, False, 2325, None),  # 3 x (750 + 5) + 60, podman: no watchdog
        (4260, True, 12855, 30),  # a 70B model on Instinct over docker
        (425, False, 1350, None),  # a balancer in front of instances of a 360 s budget
    ],
)
def test_healing_figures_come_from_the_start_budget(
    start_s: int, supervised: bool, interval_s: int, watchdog_s: int | None
) -> None:
    assert healing_for("on-failure", start_s, supervised=supervised) == Healing(
        restart="on-failure",
        restart_sec=5,
        start_limit_burst=3,
        start_limit_interval_s=interval_s,
        watchdog_s=watchdog_s,
        stall_s=120,
        restart_clean_exit=not supervised,  # podman's clean exit restarts too
    )


def test_restart_no_keeps_every_other_figure() -> None:
    """`restart = "no"` changes only the restart: the watchdog still kills a hung engine, which then
    stays down (docs/healing.md, "Restart policy")."""
    healed = healing_for("on-failure", 360, supervised=True)
    assert healing_for("no", 360, supervised=True) == healed.model_copy(update={"restart": "no"})


def test_the_balancer_waits_out_an_instance_start_without_a_watchdog() -> None:
    """Its ready check waits for an instance still starting or restarting: its budget is an
    instance's, the pause and a margin (360 + 5 + 60)."""
    assert balancer_start_s(360) == 425
    assert balancer_healing("on-failure", 360) == healing_for("on-failure", 425, supervised=False)
    assert balancer_healing("on-failure", 360).start_limit_interval_s == 1350
    assert balancer_healing("on-failure", 360).watchdog_s is None
    assert balancer_healing("no", 360).restart == "no"


@pytest.mark.parametrize(
    ("host", "runtimes", "text", "supervised"),
    [
        ("genoa-9654-2s-nps4", None, HOST_VLLM, True),
        ("milan-7763-2s", DOCKER, "", True),
        ("genoa-9654-2s-nps4", None, "", False),  # podman 5, Quadlet
    ],
)
def test_the_planner_heals_every_path_by_default(
    ws: PlanWorkspace,
    host_of: HostOf,
    host: str,
    runtimes: RuntimeFacts | None,
    text: str,
    supervised: bool,
) -> None:
    plan = _plan(ws, host_of(host, runtimes), text)
    assert plan.decisions.restart == "on-failure"
    assert plan.decisions.healing == healing_for(
        "on-failure", plan.decisions.start_timeout_s, supervised=supervised
    )
    assert (plan.decisions.runtime == "podman") == (not supervised)


def test_restart_no_in_the_file_is_in_both_fields(ws: PlanWorkspace, host_of: HostOf) -> None:
    plan = _plan(ws, host_of("genoa-9654-2s-nps4"), HOST_VLLM + 'restart = "no"\n')
    assert plan.decisions.restart == "no"
    assert plan.decisions.healing == healing_for(
        "no", plan.decisions.start_timeout_s, supervised=True
    )


@pytest.mark.parametrize(("text", "supervised"), [("", False), (HOST_VLLM, True)])
def test_each_instance_heals_by_its_runtime_and_the_balancer_by_its_own(
    ws: PlanWorkspace, host_of: HostOf, text: str, supervised: bool
) -> None:
    plan = _plan(ws, host_of("vm-zen5-24g"), text + "instances = 2\n", name="pair")
    assert plan.instance_set is not None
    assert plan.decisions.healing == balancer_healing(
        "on-failure", max(m.start_timeout_s for m in plan.decisions.members)
    )
    for member in plan.decisions.members:
        assert member.healing == healing_for(
            "on-failure", member.start_timeout_s, supervised=supervised
        )


def test_restart_no_reaches_the_instances_and_the_balancer(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    plan = _plan(ws, host_of("vm-zen5-24g"), 'instances = 2\nrestart = "no"\n', name="pair")
    assert plan.instance_set is not None
    assert plan.decisions.healing == balancer_healing(
        "no", plan.decisions.members[0].start_timeout_s
    )
    assert {m.restart for m in plan.decisions.members} == {"no"}
    assert {m.healing.restart for m in plan.decisions.members if m.healing} == {"no"}
