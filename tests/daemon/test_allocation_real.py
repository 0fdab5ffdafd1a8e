"""Allocation with the real planner: an approved endpoint that does not run keeps its port
and its socket when a new endpoint file comes."""

from __future__ import annotations

import json

import pytest

from tests.daemon.conftest import DaemonSandbox

pytestmark = pytest.mark.vllm


def test_an_approved_endpoint_not_running_keeps_its_port_and_socket(ws: DaemonSandbox) -> None:
    """Approved with --no-start (or stopped): a new endpoint file, first in name order,
    gets neither its port nor its CPUs, and it stays approved."""
    ws.endpoint("b", 'port = "auto"\n')
    approved = ws.approve("b").plan
    ws.endpoint("a", 'port = "auto"\n')
    done = ws.epycctl("status", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["endpoints"]}
    assert rows["b"]["state"] == "approved", rows["b"]["reasons"]
    assert rows["a"]["state"] == "pending-approval"
    assert rows["a"]["port"] != approved.decisions.port
    assert rows["a"]["socket"] != approved.decisions.socket
    ws.approve("a")
