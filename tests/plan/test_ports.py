"""Ports: distinct across endpoints, "auto" from 8000 skipping ports in use on the host."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epycd.host.facts import HostFacts
from epycd.plan.placement.ports import (
    Listener,
    PortRequest,
    assign_ports,
    endpoint_of_pid,
    listening_ports,
)
from tests.plan.conftest import PlanWorkspace, cpu

HostOf = Callable[..., HostFacts]
FILE = Path("/etc/epyc-llm/x.toml")


def test_auto_ports_count_up_from_8000_around_explicit_ones() -> None:
    requests = [PortRequest("a", FILE, None), PortRequest("b", FILE, 8001),
                PortRequest("c", FILE, None), PortRequest("d", FILE, None)]  # fmt: skip
    assert assign_ports(requests, {}, 8000) == {"a": 8000, "b": 8001, "c": 8002, "d": 8003}


def test_ports_bound_on_the_host_are_skipped_unless_the_endpoint_holds_them() -> None:
    listeners = {
        8000: Listener(pid=10, process="nginx", endpoint=None),
        8001: Listener(pid=11, process="python3", endpoint="b"),
    }
    requests = [PortRequest("a", FILE, None), PortRequest("b", FILE, None)]
    assert assign_ports(requests, listeners, 8000) == {"a": 8002, "b": 8001}


def test_explicit_port_clashes_are_errors_naming_the_key() -> None:
    listeners = {9000: Listener(pid=10, process="nginx", endpoint=None)}
    requests = [PortRequest("a", FILE, 8100), PortRequest("b", FILE, 8100),
                PortRequest("c", FILE, 9000)]  # fmt: skip
    got = assign_ports(requests, listeners, 8000)
    assert got["a"] == 8100
    assert not isinstance(got["b"], int) and got["b"].key == "port"
    assert "endpoint a" in str(got["b"]) and got["b"].exit_code == 2
    assert not isinstance(got["c"], int) and "nginx (pid 10)" in str(got["c"])
    assert got["c"].exit_code == 1


@pytest.fixture
def bound_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_listening_ports_sees_a_real_listener(bound_port: int) -> None:
    listener = listening_ports()[bound_port]
    assert listener.pid == os.getpid()
    assert listener.endpoint is None


def test_endpoint_of_pid_reads_the_unit_from_the_cgroup(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(
        "0::/system.slice/epyc-llm-qwen3.service/libpod-payload-abc\n"
    )
    assert endpoint_of_pid(42, tmp_path) == "qwen3"
    assert endpoint_of_pid(43, tmp_path) is None


@pytest.mark.parametrize(
    "cgroup",
    [
        "4:cpuset:/docker/{id}\n0::/docker/{id}\n",  # the cgroupfs driver (cgroup v1)
        "0::/system.slice/docker-{id}.scope\n",  # the systemd driver (cgroup v2)
    ],
)
def test_endpoint_of_pid_reads_a_docker_container_name(tmp_path: Path, cgroup: str) -> None:
    """A docker endpoint's vLLM runs under dockerd's cgroup, not its unit's: docker's record
    of the container (named by the unit's `docker run --name`) says whose it is."""
    proc, containers = tmp_path / "proc", tmp_path / "containers"
    ours, other = "a" * 64, "b" * 64
    for pid, container, name in ((42, ours, "/epyc-llm-olmo"), (43, other, "/epyc-llm-web-x")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cgroup.format(id=container))
        (containers / container).mkdir(parents=True)
        (containers / container / "config.v2.json").write_text(json.dumps({"Name": name}))
    (containers / other / "config.v2.json").write_text(json.dumps({"Name": "/web"}))
    (proc / "44").mkdir()
    (proc / "44" / "cgroup").write_text(cgroup.format(id="c" * 64))

    assert endpoint_of_pid(42, proc, containers) == "olmo"
    assert endpoint_of_pid(43, proc, containers) is None, "not a container epyc-llm named"
    assert endpoint_of_pid(44, proc, containers) is None, "no record (or not root's to read)"


def test_plan_skips_a_port_in_use_on_this_machine(
    ws: PlanWorkspace, host_of: HostOf, bound_port: int
) -> None:
    ws.endpoint("a", f"port = {bound_port}\n")
    ws.endpoint("b")
    results = ws.plan(host_of("genoa-9654-2s-nps1"), listeners=None)
    assert results["a"].exit_code == 1 and results["a"].errors[0].key == "port"
    plan = cpu(results["b"].plan)
    assert plan.port != bound_port
    assert plan.vllm_args[plan.vllm_args.index("--port") + 1] == str(plan.port)
