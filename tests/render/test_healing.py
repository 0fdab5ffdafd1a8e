"""The healing lines of every unit (docs/healing.md, epycd.render.healing): per path, with
`restart = "no"`, for an instance of a set and its balancer, decisions from before the healing
policy (no `healing`), and what Quadlet 5.4 makes of them."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.errors import InputError
from epycd.host.facts import HostFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.healing import balancer_start_s, start_limit_interval_s
from epycd.plan.model import AnyServer
from epycd.render import render_units
from epycd.render.balancer import haproxy_config
from tests.plan.conftest import PlanWorkspace
from tests.render.fixtures import (
    CASES,
    PRODUCT_PYTHON,
    runnable,
    set_decisions,
    units_of,
    with_restart,
)
from tests.render.realtools import quadlet_dryrun, verify, write_units

HostOf = Callable[..., HostFacts]
HEALING_KEYS = ("Restart", "RestartSec", "WatchdogSec", "LimitCORE", "StartLimitIntervalSec",
                "StartLimitBurst", "ExecStopPost", "HealthOnFailure")  # fmt: skip


def sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Section name -> its `Key=value` lines, in order."""
    found: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            found[current] = []
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[current].append((key, value))
    return found


def healing_lines(text: str) -> dict[str, list[tuple[str, str]]]:
    """Only the healing keys of each section, in order."""
    return {
        name: [(key, value) for key, value in lines if key in HEALING_KEYS]
        for name, lines in sections(text).items()
    }


def only_unit(decisions: EndpointDecisions | AnyServer) -> str:
    [text] = units_of(decisions).values()
    return text


def recorder(name: str, unit: str, python: str = PRODUCT_PYTHON) -> tuple[str, str]:
    return ("ExecStopPost", f"-+{python} -m epycd.approval.crashloop {name} --unit {unit}")


def supervisor_argv(text: str) -> list[str]:
    [start] = [value for key, value in sections(text)["Service"] if key == "ExecStart"]
    argv = shlex.split(start)
    return argv[: argv.index("--")]


@pytest.mark.parametrize(
    ("case", "interval"), [("host-vllm", "3675s"), ("milan-docker", "3675s")]
)  # 3 x (1200 + 5) + 60
def test_a_supervised_unit_restarts_and_has_a_watchdog(case: str, interval: str) -> None:
    decisions = CASES[case]()
    text = only_unit(decisions)
    assert healing_lines(text) == {
        "Unit": [("StartLimitIntervalSec", interval), ("StartLimitBurst", "5")],
        "Service": [
            ("Restart", "on-failure"),
            ("RestartSec", "5s"),
            ("WatchdogSec", "30s"),
            ("LimitCORE", "0"),
            recorder(decisions.endpoint, decisions.unit_name),
        ],
        "Install": [],
    }
    argv = supervisor_argv(text)
    assert argv[argv.index("--stall-timeout") + 1] == "120"


def test_podman_5_kills_an_unhealthy_container_and_restarts_without_a_watchdog() -> None:
    text = only_unit(CASES["genoa-podman"]())
    assert healing_lines(text) == {
        "Unit": [("StartLimitIntervalSec", "3675s"), ("StartLimitBurst", "5")],
        "Container": [("HealthOnFailure", "kill")],
        "Service": [
            ("Restart", "on-failure"),
            ("RestartSec", "5s"),
            recorder("qwen", "epyc-llm-qwen"),
        ],
        "Install": [],
    }
    assert "--stall-timeout" not in text


def test_podman_before_5_restarts_on_failure_only() -> None:
    """No health check runs after the start there: nothing kills a hung container."""
    text = only_unit(CASES["podman-before-5"]())
    assert healing_lines(text) == {
        "Unit": [("StartLimitIntervalSec", "3675s"), ("StartLimitBurst", "5")],
        "Container": [],
        "Service": [
            ("Restart", "on-failure"),
            ("RestartSec", "5s"),
            recorder("qwen-old", "epyc-llm-qwen-old"),
        ],
        "Install": [],
    }


def test_restart_no_keeps_the_watchdog_and_the_recorder_but_no_start_limit() -> None:
    text = only_unit(CASES["host-vllm-token"]())
    assert healing_lines(text) == {
        "Unit": [],
        "Service": [
            ("Restart", "no"),
            ("WatchdogSec", "30s"),
            ("LimitCORE", "0"),
            recorder("host-llama", "epyc-llm-host-llama"),
        ],
        "Install": [],
    }
    podman = only_unit(with_restart(CASES["genoa-podman"](), "no"))
    assert healing_lines(podman)["Container"] == [("HealthOnFailure", "kill")]
    assert healing_lines(podman)["Service"][0] == ("Restart", "no")


@pytest.mark.parametrize("case", sorted(CASES))
def test_decisions_before_issue_27_render_the_units_of_their_time(case: str) -> None:
    """An approval record without `healing`: Restart= as it was, nothing new."""
    decisions = CASES[case]().model_copy(update={"healing": None})
    text = only_unit(decisions)
    expected = [("Restart", "on-failure"), ("RestartSec", "30s")]
    if decisions.restart == "no":
        expected = [("Restart", "no")]
    assert healing_lines(text)["Service"] == expected
    assert all(not lines for name, lines in healing_lines(text).items() if name != "Service")
    assert "--stall-timeout" not in text


def _set(ws: PlanWorkspace, host_of: HostOf, text: str) -> Plan:
    """A set of two podman instances on the 2-core VM."""
    ws.endpoint("pair", text)
    result = ws.plan(host_of("vm-zen5-24g"))["pair"]
    assert result.plan is not None and result.plan.instance_set is not None, result.errors
    return result.plan


def test_an_instance_records_and_checks_its_own_unit(ws: PlanWorkspace, host_of: HostOf) -> None:
    """The recorder and the boot check name the instance's unit, so a crash loop of one
    instance keeps that one down (the balancer's check means the endpoint's own unit)."""
    plan = _set(ws, host_of, "instances = 2\n")
    for index in (1, 2):
        text = plan.units[f"epyc-llm-pair_{index}.container"]
        service = healing_lines(text)["Service"]
        assert service[-1] == recorder(
            "pair", f"epyc-llm-pair_{index}", plan.decisions.product_python
        )
        python = plan.decisions.product_python
        check = f"{python} -m epycd.approval.check pair --unit epyc-llm-pair_{index}"
        assert ("ExecCondition", check) in sections(text)["Service"]
        assert ("PartOf", "epyc-llm-pair.service") in sections(text)["Unit"]
    balancer = sections(plan.units["epyc-llm-pair.service"])["Service"]
    assert (
        "ExecCondition",
        f"+{plan.decisions.product_python} -m epycd.approval.check pair",
    ) in balancer


def test_the_balancer_wants_its_instances_and_restarts_on_its_own_budget(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    plan = _set(ws, host_of, "instances = 2\n")
    text = plan.units["epyc-llm-pair.service"]
    unit = sections(text)["Unit"]
    members = "epyc-llm-pair_1.service epyc-llm-pair_2.service"
    assert ("Wants", members) in unit
    assert not [key for key, _ in unit if key in ("Requires", "BindsTo", "Requisite")]
    budget = balancer_start_s(plan.decisions.start_timeout_s)
    assert plan.instance_set is not None
    assert plan.decisions.start_timeout_s == max(m.start_timeout_s for m in plan.decisions.members)
    assert healing_lines(text) == {
        "Unit": [
            ("StartLimitIntervalSec", f"{start_limit_interval_s(budget)}s"),
            ("StartLimitBurst", "5"),
        ],
        "Service": [("Restart", "on-failure"), ("RestartSec", "5s")],
        "Install": [],
    }
    assert ("TimeoutStartSec", str(budget)) in sections(text)["Service"]


def test_the_balancer_of_restart_no_stays_down(ws: PlanWorkspace, host_of: HostOf) -> None:
    plan = _set(ws, host_of, 'instances = 2\nrestart = "no"\n')
    text = plan.units["epyc-llm-pair.service"]
    assert healing_lines(text) == {"Unit": [], "Service": [("Restart", "no")], "Install": []}


def test_a_balancer_before_issue_27_requires_its_instances(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    plan = _set(ws, host_of, "instances = 2\n")
    [text] = [
        t
        for name, t in render_units(plan.decisions.model_copy(update={"healing": None})).items()
        if name == "epyc-llm-pair.service"
    ]
    unit = sections(text)["Unit"]
    assert ("Requires", "epyc-llm-pair_1.service epyc-llm-pair_2.service") in unit
    assert healing_lines(text)["Service"] == [("Restart", "on-failure")]
    assert not [key for key, _ in sections(text)["Service"] if key == "TimeoutStartSec"]


def test_haproxy_retries_a_failed_connection_elsewhere_and_marks_the_instance_down(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    config = haproxy_config(set_decisions(_set(ws, host_of, "instances = 2\n")))
    backend = config.split("\nbackend instances\n")[1]
    lines = [line.strip() for line in backend.splitlines()]
    assert lines[:4] == ["balance leastconn", "retries 3", "option redispatch 1",
                         "retry-on conn-failure"]  # fmt: skip
    assert (
        "default-server check inter 2s fall 2 rise 1 observe layer4 error-limit 1 "
        "on-error mark-down"
    ) in lines


@pytest.mark.quadlet
def test_quadlet_passes_health_on_failure_to_podman_and_keeps_the_recorder(
    tmp_path: Path, product_python: str, real_vllm: Path
) -> None:
    decisions = runnable(CASES["genoa-podman"](), product_python, real_vllm)
    write_units(tmp_path / "quadlet", units_of(decisions))
    [(name, generated)] = quadlet_dryrun(tmp_path / "quadlet").items()
    service = sections(generated)["Service"]
    [start] = [value for key, value in service if key == "ExecStart"]
    assert " --health-on-failure kill " in start
    stop_posts = [value for key, value in service if key == "ExecStopPost"]
    assert stop_posts[0] == (
        f"-+{product_python} -m epycd.approval.crashloop qwen --unit epyc-llm-qwen"
    )
    assert ("Restart", "on-failure") in service and ("RestartSec", "5s") in service
    assert ("StartLimitBurst", "5") in sections(generated)["Unit"]
    verify(write_units(tmp_path / "generated", {name: generated}))


@pytest.mark.parametrize(
    ("case", "change", "words"),
    [
        ("genoa-podman", {"watchdog_s": 30}, "a podman unit cannot have a watchdog"),
        ("host-vllm", {"restart_sec": 0}, "healing restart_sec must be positive"),
        ("milan-docker", {"start_limit_burst": 0, "stall_s": -1},
         "healing stall_s, start_limit_burst must be positive"),
    ],
)  # fmt: skip
def test_healing_that_cannot_work_is_refused(case: str, change: dict[str, int], words: str) -> None:
    decisions = CASES[case]()
    assert decisions.healing is not None
    broken = decisions.model_copy(update={"healing": decisions.healing.model_copy(update=change)})
    with pytest.raises(InputError) as raised:
        units_of(broken)
    assert words in str(raised.value) and raised.value.key == "healing"
    assert raised.value.file == decisions.config_file
