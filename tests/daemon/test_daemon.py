"""`epycd` as a real subprocess with a test-made NOTIFY_SOCKET: READY=1 once the endpoints
it starts are ready or failed, STATUS= counts, status.json, config changes noticed by
polling and by SIGHUP (RELOADING=1 then READY=1), SIGTERM -> STOPPING=1 and exit 0; it
starts only approved, unchanged, not stopped, never-failed endpoints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epycd.daemon import endpoint_cpus, spare_cpus
from epycd.metrics.load import parse_sample
from tests.daemon.conftest import DaemonSandbox, free_port
from tests.health.notifysock import NotifySocket
from tests.metrics.servers import answering, recorded
from tests.render.fixtures import as_plan, milan_docker
from tests.sandbox import REPO

pytestmark = pytest.mark.vllm
CHAT = "epyc-llm-chat.service"
BASE = "epyc-llm-base.service"
WAIT = 90.0


@contextmanager
def daemon(
    ws: DaemonSandbox, *args: str, **extra: str
) -> Iterator[tuple[subprocess.Popen[str], NotifySocket]]:
    with NotifySocket(ws.tmp / "notify.sock") as sock:
        process = subprocess.Popen(
            [sys.executable, "-m", "epycd.daemon", "--poll-interval", "0.3",
             "--refresh-interval", "0.5", *args],
            env=ws.environ(NOTIFY_SOCKET=str(sock.path)) | extra,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            yield process, sock
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(10)
            if process.stdout:
                sys.stderr.write(process.stdout.read())


def status_file(ws: DaemonSandbox) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ws.settings.run_dir / "status.json").read_text())
    return data


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in data["endpoints"]}


def stop_daemon(process: subprocess.Popen[str], sock: NotifySocket) -> None:
    process.send_signal(signal.SIGTERM)
    stopping = sock.wait_for("STOPPING=1", WAIT)
    assert stopping is not None
    assert process.wait(WAIT) == 0


def test_ready_after_the_endpoint_is_ready_then_polling_sighup_and_sigterm(
    ws: DaemonSandbox,
) -> None:
    ws.endpoint("base")
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(CHAT, "inactive")
    with daemon(ws, FAKE_START_STATE="activating") as (process, sock):
        waiting = sock.wait_for("STATUS=1 starting, 1 needs approval; waiting for chat", WAIT)
        assert waiting is not None, sock.fields()
        assert f"start --no-block {CHAT}" in ws.systemctl_calls()
        assert sock.wait_for("READY=1", 3.0) is None  # still starting: no READY yet
        assert status_file(ws)["daemon"]["state"] == "starting"

        ws.supervisor_says("chat", "ready", phase="request")
        ws.set_unit(CHAT, "active")
        ready = sock.wait_for("READY=1", WAIT)
        assert ready is not None
        assert "STATUS=1 ready, 1 needs approval" in ready.split("\n")
        data = status_file(ws)
        assert data["daemon"]["state"] == "ready"
        assert data["daemon"]["summary"] == "1 ready, 1 needs approval"
        endpoints = by_name(data)
        assert endpoints["chat"]["state"] == "ready"
        assert endpoints["chat"]["handoff"]["base_url"] == endpoints["chat"]["url"]
        assert endpoints["base"]["state"] == "pending-approval"

        ws.endpoint("new")  # no socket left for a third endpoint: planned with an error
        noticed = sock.wait_for("STATUS=1 ready, 2 needs approval", WAIT)
        assert noticed is not None
        assert "RELOADING=1" not in sock.fields()
        assert "new" in by_name(status_file(ws))

        (ws.settings.config_dir / "new.toml").unlink()
        process.send_signal(signal.SIGHUP)
        reloading = sock.wait_for("RELOADING=1", WAIT)
        assert reloading is not None
        assert any(line.startswith("MONOTONIC_USEC=") for line in reloading.split("\n"))
        again = sock.wait_for("READY=1", WAIT)
        assert again is not None
        assert "STATUS=1 ready, 1 needs approval" in again.split("\n")
        assert "new" not in by_name(status_file(ws))

        stop_daemon(process, sock)
    assert ws.units()[CHAT]["ActiveState"] == "active"  # the endpoint keeps running
    assert [c for c in ws.systemctl_calls() if c.startswith("stop")] == []


def test_it_serves_metrics_and_keeps_the_serving_instances_load(ws: DaemonSandbox) -> None:
    """The real daemon on metrics_listen: its series for the ready endpoint, the instance's
    own (a local server answering real vLLM's recorded /metrics on the endpoint's port,
    started after READY=1 so that the plan does not see its port taken), and the load in
    status.json."""
    ws.endpoint("chat")
    approval = ws.approve("chat")
    ws.supervisor_says("chat", "ready", phase="request", seconds={"health": 30.5, "request": 1})
    ws.set_unit(CHAT, "active")
    listen = f"127.0.0.1:{free_port()}"
    with daemon(ws, EPYCD_METRICS_LISTEN=listen) as (process, sock):
        assert sock.wait_for("READY=1", WAIT) is not None
        with answering(port=approval.plan.decisions.port):
            deadline = time.monotonic() + WAIT
            while not by_name(status_file(ws))["chat"]["load"] and time.monotonic() < deadline:
                time.sleep(0.2)
            [load] = by_name(status_file(ws))["chat"]["load"]
            text = httpx.get(f"http://{listen}/metrics", timeout=5).text
        stop_daemon(process, sock)
    recorded_sample = parse_sample(recorded(), at=0)
    assert (load["running"], load["waiting"], load["kv_cache_usage"]) == (
        recorded_sample.running,
        recorded_sample.waiting,
        recorded_sample.kv_cache_usage,
    )
    found = {
        (s.name, s.labels.get("endpoint"), s.labels.get("state")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("epyc_llm_endpoint_state", "chat", "ready")] == 1
    assert found[("epyc_llm_instance_up", "chat", None)] == 1
    assert found[("epyc_llm_instance_startup_seconds", "chat", None)] == 31.5
    assert found[("vllm_generation_tokens_total", "chat", None)] > 0


def test_stopped_changed_and_failed_endpoints_are_not_started(ws: DaemonSandbox) -> None:
    base = ws.endpoint("base")
    ws.endpoint("chat")
    ws.approve("base")
    ws.approve("chat")
    ws.set_unit(BASE, "inactive")
    ws.set_unit(CHAT, "active")
    assert ws.epycctl("stop", "chat").returncode == 0
    base.write_text(base.read_text() + "max_model_len = 2048\n")
    with daemon(ws) as (process, sock):
        ready = sock.wait_for("READY=1", WAIT)
        assert ready is not None
        assert "STATUS=1 stopped, 1 changed, needs approval" in ready.split("\n")
        ws.set_unit(BASE, "failed", result="exit-code")
        base.write_text(base.read_text().replace("max_model_len = 2048\n", ""))
        failed = sock.wait_for("STATUS=1 failed, 1 stopped", WAIT)
        assert failed is not None
        stop_daemon(process, sock)
    assert not [c for c in ws.systemctl_calls() if c.startswith("start")]


def test_ready_is_bounded_when_an_endpoint_never_settles(ws: DaemonSandbox) -> None:
    ws.endpoint("chat")
    ws.approve("chat")
    ws.set_unit(CHAT, "activating")
    with daemon(ws, "--settle-timeout", "2") as (process, sock):
        started = time.monotonic()
        ready = sock.wait_for("READY=1", WAIT)
        assert ready is not None
        assert "STATUS=1 starting" in ready.split("\n")
        assert time.monotonic() - started >= 1.0
        stop_daemon(process, sock)


def test_daemon_cpus_are_the_complement_of_the_endpoints() -> None:
    plans = [as_plan(milan_docker(), cpus="0-3"), as_plan(milan_docker(), cpus="8")]
    taken = endpoint_cpus(plans, {0: [16], 8: [24]})
    assert taken == {0, 1, 2, 3, 8, 16, 24}
    assert spare_cpus(set(range(32)), taken) == set(range(32)) - taken
    assert spare_cpus({0, 1}, {0, 1}) == {0, 1}  # no spare core: stay where allowed
