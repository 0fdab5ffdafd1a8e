"""A multi-instance endpoint (docs/instances.md) through approval, status and remove, from real
files: the real planner on a fake dual Genoa, the approval code, and the fake systemctl's unit
states (systemd is not PID 1 here; tests/e2e runs the real one)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from epycd.approval.ready import POLL_S
from tests.daemon.conftest import DaemonSandbox
from tests.sandbox import REPO

pytestmark = pytest.mark.vllm

BALANCER = "epyc-llm-pair.service"
INSTANCES = ("epyc-llm-pair_1.service", "epyc-llm-pair_2.service")


def status_of(ws: DaemonSandbox, name: str) -> dict[str, Any]:
    done = ws.epycctl("status", "--json")
    assert done.returncode == 0, done.stderr
    entries: dict[str, dict[str, Any]] = {
        e["name"]: e for e in json.loads(done.stdout)["endpoints"]
    }
    return entries[name]


def test_one_approval_installs_the_set(ws: DaemonSandbox) -> None:
    ws.endpoint("pair", "instances = 2\n")
    approval = ws.approve("pair")
    assert sorted(approval.units) == sorted([BALANCER, *INSTANCES])
    for record in approval.units.values():
        assert Path(record.path).is_file()


def test_ready_then_degraded_when_an_instance_fails(ws: DaemonSandbox) -> None:
    ws.endpoint("pair", "instances = 2\n")
    approval = ws.approve("pair")
    for unit in (BALANCER, *INSTANCES):
        ws.set_unit(unit, "active")
    pair = status_of(ws, "pair")
    assert pair["state"] == "ready" and pair["balancer"] == "active"
    instances = pair["instances"]
    assert isinstance(instances, list)
    assert [(i["unit"], i["state"]) for i in instances] == [(u, "ready") for u in INSTANCES]
    assert approval.plan.instance_set is not None
    assert [i["port"] for i in instances] == [m.port for m in approval.plan.decisions.members]

    ws.set_unit(INSTANCES[1], "failed", "exit-code")
    pair = status_of(ws, "pair")
    assert pair["state"] == "degraded"
    assert "1 of 2 instances ready" in str(pair["reason"])
    assert [i["state"] for i in pair["instances"]] == ["ready", "failed:start"]
    text = ws.epycctl("status", "pair")
    assert text.returncode == 0, text.stderr
    assert f"instance 2 {INSTANCES[1]}: failed:start" in text.stdout
    assert "degraded" in text.stdout


def test_changed_set_needs_approval_and_remove_removes_every_unit(ws: DaemonSandbox) -> None:
    path = ws.endpoint("pair", "instances = 2\n")
    approval = ws.approve("pair")
    path.write_text(path.read_text() + "min_ready = 1\n")
    pair = status_of(ws, "pair")
    assert pair["state"] == "changed-needs-approval"
    assert '-    "min_ready": 2,\n+    "min_ready": 1,' in str(pair["diff"])
    done = ws.epycctl("remove", "pair", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert not any(Path(record.path).exists() for record in approval.units.values())


@pytest.mark.parametrize(("min_ready", "code"), [(1, 0), (2, 1)])
def test_the_balancer_starts_only_with_min_ready_instances_up(
    ws: DaemonSandbox, min_ready: int, code: int
) -> None:
    """The balancer's ExecStartPre (python -m epycd.approval.ready), against systemctl's
    answers: one instance up and one failed is enough for min_ready = 1, not for 2."""
    ws.endpoint("pair", f"instances = 2\nmin_ready = {min_ready}\n")
    approval = ws.approve("pair")
    balancer = approval.plan.units[BALANCER]
    python = approval.plan.decisions.product_python
    assert f"ExecStartPre=+{python} -m epycd.approval.ready pair" in balancer
    ws.set_unit(INSTANCES[0], "active")
    ws.set_unit(INSTANCES[1], "failed", "exit-code")
    done = ws.epycctl("pair", module="epycd.approval.ready")
    assert done.returncode == code, done.stdout + done.stderr
    if code:
        assert f"fewer than min_ready = 2: {INSTANCES[1]} (failed)" in done.stderr
    else:
        assert "1 of 2 instances ready" in done.stdout


def test_the_ready_check_without_a_set_is_bad_input(ws: DaemonSandbox) -> None:
    done = ws.epycctl("nothing", module="epycd.approval.ready")
    assert done.returncode == 2 and "no approved multi-instance endpoint nothing" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_ready_check_waits_for_an_instance_on_its_way_back(ws: DaemonSandbox) -> None:
    """An instance still `activating` (starting, or waiting out RestartSec= after a failure) is
    waited for, not taken as down: a balancer that failed would restart, and on systemd 252
    restart every instance PartOf= it with it. It passes once the instance is active; fails once
    no instance that is down can still come up."""
    ws.endpoint("pair", "instances = 2\n")
    ws.approve("pair")
    ws.set_unit(INSTANCES[0], "active")
    ws.set_unit(INSTANCES[1], "activating")
    check = subprocess.Popen(
        [sys.executable, "-m", "epycd.approval.ready", "pair"],
        env=ws.environ(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3 * POLL_S)
    assert check.poll() is None, "the check did not wait for the instance still starting"
    ws.set_unit(INSTANCES[1], "active")
    out, err = check.communicate(timeout=30)
    assert check.returncode == 0, out + err
    assert "2 of 2 instances ready" in out

    ws.set_unit(INSTANCES[1], "failed", "exit-code")
    done = ws.epycctl("pair", module="epycd.approval.ready")
    assert done.returncode == 1, done.stdout + done.stderr
