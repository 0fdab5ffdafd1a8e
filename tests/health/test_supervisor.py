"""The supervisor's process handling, with a stand-in server that exits as told.

The real-vLLM runs are in test_supervisor_vllm.py; a stand-in is used here because only it
can exit with a chosen status or die at a chosen moment.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from epycd.supervisor import SupervisorStatus, read_status, write_status
from epycd.supervisor.process import LogTail
from tests.health.notifysock import NotifySocket
from tests.health.realvllm import REPO, free_port
from tests.health.supervising import (
    session_members,
    start_supervisor,
    supervisor_argv,
    wait_for_state,
)
from tests.sandbox import run_python

STUB = str(REPO / "tests" / "health" / "stub_server.py")


def stub(port: int, model: str = "tiny", *options: str) -> list[str]:
    return [sys.executable, STUB, str(port), model, *options]


@pytest.fixture
def run(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> Callable[..., tuple[subprocess.Popen[bytes], Path, Path]]:
    def start(
        server: list[str], port: int, *extra: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path, Path]:
        status = tmp_path / "run" / "status.json"
        log = tmp_path / "supervisor.log"
        argv = supervisor_argv(
            url=f"http://127.0.0.1:{port}",
            model="tiny",
            status_file=status,
            server=server,
            extra=extra,
        )
        supervisor = start_supervisor(argv, env or dict(os.environ), log)
        reap.append(supervisor)
        return supervisor, status, log

    return start


Run = Callable[..., tuple[subprocess.Popen[bytes], Path, Path]]


def test_ready_then_sigterm_passes_the_server_exit_status_on(tmp_path: Path, run: Run) -> None:
    port = free_port()
    with NotifySocket(tmp_path / "notify") as sock:
        env = os.environ | {"NOTIFY_SOCKET": str(sock.path)}
        sup, status_file, log = run(
            stub(port, "tiny", "--exit-on-term", "7", "--listen-after", "0.5"),
            port,
            env=env,
        )
        ready = sock.wait_for("READY=1", 30)
        assert ready is not None, log.read_text()
        assert f"STATUS=serving tiny on http://127.0.0.1:{port}" in ready.split("\n")
        status = read_status(status_file)
        assert status is not None and status.state == "ready"
        assert set(status.seconds) == {"health", "models", "request"}
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(15) == 7
        assert sock.wait_for("STOPPING=1", 2) is not None
    stopped = read_status(status_file)
    assert stopped is not None and stopped.state == "stopped"
    assert "server exited with status 7" in stopped.reason
    text = log.read_text()
    assert "stub: signal 15, exiting 7" in text, "SIGTERM was forwarded to the server"
    assert "stub: a line on stderr" in text, "the server's stderr passes through"
    assert status.pid is not None and not session_members(status.pid)


def test_server_dying_by_a_signal_while_serving(tmp_path: Path, run: Run) -> None:
    port = free_port()
    sup, status_file, log = run(stub(port), port)
    status = wait_for_state(status_file, 30)
    assert status is not None and status.state == "ready" and status.pid, log.read_text()
    os.kill(status.pid, signal.SIGKILL)
    assert sup.wait(15) == -signal.SIGKILL
    failed = read_status(status_file)
    assert failed is not None
    assert (failed.state, failed.phase) == ("failed", "serving")
    assert "status -9" in failed.reason
    assert "stub: listening on" in "\n".join(failed.log_tail)


def test_a_clean_exit_nobody_asked_for_is_a_failed_run(tmp_path: Path, run: Run) -> None:
    """vLLM's API server exits 0 when its EngineCore dies (killed by the kernel's OOM killer):
    a run that ends so is a failure, or Restart=on-failure never brings the endpoint back."""
    port = free_port()
    sup, status_file, log = run(stub(port, "tiny", "--exit-after", "4", "0"), port)
    status = wait_for_state(status_file, 30)
    assert status is not None and status.state == "ready", log.read_text()
    assert sup.wait(15) == 1, log.read_text()
    failed = read_status(status_file)
    assert failed is not None
    assert (failed.state, failed.phase) == ("failed", "serving")
    assert "server exited with status 0 while serving" in failed.reason
    assert "nobody asked the server to stop" in log.read_text()


def test_a_dead_front_end_takes_its_engine_with_it_at_once(tmp_path: Path, run: Run) -> None:
    """vLLM's engine processes outlive a killed `vllm serve` and hold its output open; the
    supervisor kills them with it and is gone in a moment, not after waiting on their pipes, so
    systemd restarts the endpoint within its start-up + 15 s."""
    port = free_port()
    sup, status_file, log = run(stub(port, "tiny", "--engine-child"), port)
    status = wait_for_state(status_file, 30)
    assert status is not None and status.state == "ready" and status.pid, log.read_text()
    assert len(session_members(status.pid)) == 2, "the stand-in engine did not start"
    killed = time.monotonic()
    os.kill(status.pid, signal.SIGKILL)
    assert sup.wait(15) == -signal.SIGKILL
    assert time.monotonic() - killed < 3, "the supervisor waited on the engine's pipes"
    assert not session_members(status.pid), "the engine outlived the front end"


def test_gate_failure_stops_the_server_and_exits_non_zero(tmp_path: Path, run: Run) -> None:
    port = free_port()
    with NotifySocket(tmp_path / "notify") as sock:
        env = os.environ | {"NOTIFY_SOCKET": str(sock.path)}
        sup, status_file, log = run(stub(port, "another-model"), port, env=env)
        assert sup.wait(30) == 1, log.read_text()
        sock.wait_for("never", 0.5)
        fields = sock.fields()
    assert "READY=1" not in fields
    assert any(f.startswith("STATUS=failed in phase models") for f in fields), fields
    status = read_status(status_file)
    assert status is not None
    assert (status.state, status.phase) == ("failed", "models")
    assert "another-model" in status.reason
    assert any("stub: listening on" in line for line in status.log_tail)
    assert status.pid is not None and not session_members(status.pid)
    text = log.read_text()
    assert "health gate failed in phase models" in text
    assert "stub: loading another-model" in text.split("health gate failed", 1)[1]


def test_server_exiting_during_load_fails_in_health(tmp_path: Path, run: Run) -> None:
    port = free_port()
    sup, status_file, _ = run(
        stub(port, "tiny", "--listen-after", "60", "--exit-after", "0", "3"),
        port,
        "--load-timeout",
        "600",
    )
    assert sup.wait(20) == 1
    status = read_status(status_file)
    assert status is not None and (status.state, status.phase) == ("failed", "health")
    assert "server exited while loading" in status.reason


def test_sigterm_while_loading_stops_without_ready(tmp_path: Path, run: Run) -> None:
    port = free_port()
    with NotifySocket(tmp_path / "notify") as sock:
        env = os.environ | {"NOTIFY_SOCKET": str(sock.path)}
        sup, status_file, log = run(
            stub(port, "tiny", "--listen-after", "60", "--exit-on-term", "3"), port, env=env
        )
        assert sock.wait_for(
            "STATUS=loading tiny, waiting for " + f"http://127.0.0.1:{port}/health", 10
        )
        deadline = time.monotonic() + 10
        while "stub: loading" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(10) == 3, log.read_text()
        sock.wait_for("never", 0.3)
    assert "READY=1" not in sock.fields() and "STOPPING=1" in sock.fields()
    status = read_status(status_file)
    assert status is not None and status.state == "stopped"


def test_watchdog_pings_while_health_answers(tmp_path: Path, run: Run) -> None:
    port = free_port()
    with NotifySocket(tmp_path / "notify") as sock:
        env = os.environ | {"NOTIFY_SOCKET": str(sock.path), "WATCHDOG_USEC": "400000"}
        sup, _, log = run(stub(port), port, env=env)
        try:
            assert sock.wait_for("READY=1", 30) is not None, log.read_text()
            pings = [sock.wait_for("WATCHDOG=1", 2) for _ in range(3)]
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.wait(15)
    assert all(pings)
    assert sup.returncode == 0


def test_empty_api_key_file_is_bad_input(tmp_path: Path, run: Run) -> None:
    key = tmp_path / "key"
    key.write_text("\n")
    port = free_port()
    sup, status_file, log = run(stub(port), port, "--api-key-file", str(key))
    assert sup.wait(15) == 2
    assert "--api-key-file" in log.read_text() and "is empty" in log.read_text()
    assert not status_file.exists()


@pytest.mark.parametrize(
    ("endpoint", "key", "state"),
    [
        ("chat_completions", "k3y", "ready"),
        ("completions", "k3y", "ready"),
        ("chat_completions", "wrong", "failed"),
    ],
)
def test_api_key_file_and_endpoint_reach_the_gate(
    tmp_path: Path, run: Run, endpoint: str, key: str, state: str
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"{key}\n")
    port = free_port()
    sup, status_file, log = run(
        stub(port, "tiny", "--api-key", "k3y"),
        port,
        "--api-key-file",
        str(key_file),
        "--endpoint",
        endpoint,
    )
    status = wait_for_state(status_file, 30)
    assert status is not None and status.state == state, log.read_text()
    if state == "failed":
        assert status.phase == "models" and "401" in status.reason
        assert sup.wait(15) == 1
    assert "k3y" not in status.model_dump_json(), "the key never lands in the status file"


def test_log_tail_keeps_the_last_lines_and_the_first_exception() -> None:
    lines = [f"line {i}" for i in range(100)]
    lines[10:13] = ["Traceback (most recent call last):", '  File "x.py"', "ValueError: bad shape"]
    lines[60] = "RuntimeError: Engine core initialization failed"
    sink = io.BytesIO()
    tail = LogTail()
    tail.follow(io.BytesIO("".join(f"{line}\n" for line in lines).encode()), sink)
    tail.drain()
    assert tail.lines() == lines[-40:]
    assert tail.first_error()[-1] == "ValueError: bad shape"
    assert tail.first_error()[-3] == "Traceback (most recent call last):"
    assert sink.getvalue().decode().splitlines() == lines, "everything passes through"


def test_the_first_exception_may_be_qualified_and_behind_vllms_process_prefix() -> None:
    """vLLM's engine process prints the root cause (here: weights it cannot load) under its
    prefix and with the exception's module, long before the front end's RuntimeError."""
    root = (
        "(EngineCore_DP0 pid=412) safetensors_rust.SafetensorError: Error while deserializing "
        "header: incomplete metadata, file not fully covered"
    )
    lines = ["loading", "(EngineCore_DP0 pid=412) Traceback (most recent call last):", root,
             "RuntimeError: Engine core initialization failed. See root cause above."]  # fmt: skip
    tail = LogTail()
    tail.follow(io.BytesIO("".join(f"{line}\n" for line in lines).encode()), io.BytesIO())
    tail.drain()
    assert tail.first_error()[-1] == root


def test_the_api_key_credential_reaches_the_server_env_and_the_gate(
    tmp_path: Path, run: Run
) -> None:
    """A unit's LoadCredential=api_key:FILE: the supervisor reads $CREDENTIALS_DIRECTORY/api_key,
    gives it to the server as VLLM_API_KEY (never in its argv) and gates with it."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "api_key").write_text("s3cr3t-k3y\n")
    port = free_port()
    server = stub(port, "tiny", "--api-key-from-env")
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}
    env.pop("VLLM_API_KEY", None)
    sup, status_file, log = run(server, port, "--api-key-credential", "api_key", env=env)
    status = wait_for_state(status_file, 30)
    assert status is not None and status.state == "ready", log.read_text()
    assert status.pid is not None
    assert "s3cr3t-k3y" not in " ".join(psutil.Process(status.pid).cmdline())
    assert "s3cr3t-k3y" not in status_file.read_text() + log.read_text()
    sup.send_signal(signal.SIGTERM)
    sup.wait(15)


def test_the_gate_command_reads_the_api_key_credential(tmp_path: Path) -> None:
    """podman < 5's ExecStartPost gate: exit 0 with the credential, 1 without it."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "api_key").write_text("s3cr3t-k3y\n")
    port = free_port()
    server = subprocess.Popen(stub(port, "tiny", "--api-key", "s3cr3t-k3y"), cwd=REPO)
    try:
        gate = ["-m", "epycd.health", "--url", f"http://127.0.0.1:{port}"]
        gate += ["--served-model-name", "tiny", "--endpoint", "chat_completions"]
        gate += ["--timeout", "30"]
        env = {**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}
        keyed = run_python([*gate, "--api-key-credential", "api_key"], env=env)
        assert keyed.returncode == 0, keyed.stderr
        bare = run_python(gate, env=env)
        assert bare.returncode == 1 and "401" in bare.stderr
        assert "s3cr3t-k3y" not in bare.stderr + keyed.stdout
    finally:
        server.terminate()
        server.wait(15)


def test_a_server_its_user_may_not_run_is_a_clear_failure(tmp_path: Path, run: Run) -> None:
    """A vLLM the endpoint's user cannot execute (a venv made from an interpreter in a home,
    a 0700 folder): one error line and a failed status, not a Python traceback."""
    server = tmp_path / "vllm"
    server.write_text("#!/bin/sh\nexit 0\n")
    server.chmod(0o644)
    sup, status_file, log = run([str(server), "serve"], free_port())
    assert sup.wait(30) == 1, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert f"cannot run {server} as uid {os.getuid()}: Permission denied" in text, text
    status = read_status(status_file)
    assert status is not None and (status.state, status.phase) == ("failed", "start")
    assert "readable and executable by it" in status.reason


def test_the_status_file_is_for_every_user_whatever_the_umask(tmp_path: Path) -> None:
    """The endpoint unit's UMask=0077 would make it root's alone; `epycctl status` is for all."""
    path = tmp_path / "endpoints" / "x" / "status.json"
    old = os.umask(0o077)
    try:
        write_status(
            path, SupervisorStatus(state="ready", name="x", url="http://[::1]:1", model="m")
        )
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_each_run_that_passes_the_gate_counts_in_the_status_file(tmp_path: Path, run: Run) -> None:
    """The file carries the runs before it (an on-demand endpoint's cold starts,
    docs/on-demand.md): two runs on one status file count 2 and their start-ups summed; a
    run whose gate fails adds nothing."""
    counted, pid = [], None
    for _ in range(2):
        port = free_port()
        sup, status_file, log = run(stub(port), port)
        deadline = time.monotonic() + 30
        status = read_status(status_file)
        while time.monotonic() < deadline and (
            status is None or status.state != "ready" or status.pid == pid
        ):
            time.sleep(0.05)
            status = read_status(status_file)
        assert status is not None and status.state == "ready", log.read_text()
        pid = status.pid
        counted.append((status.ready_runs, status.ready_seconds, sum(status.seconds.values())))
        sup.send_signal(signal.SIGTERM)
        sup.wait(15)
    assert [runs for runs, _, _ in counted] == [1, 2]
    assert counted[1][1] == pytest.approx(counted[0][2] + counted[1][2], abs=0.01)
    stopped = read_status(status_file)
    assert stopped is not None and (stopped.state, stopped.ready_runs) == ("stopped", 2)
    port = free_port()
    exits = ("--listen-after", "5", "--exit-after", "0.3", "5")
    sup, status_file, log = run(stub(port, "tiny", *exits), port)
    sup.wait(30)
    failed = read_status(status_file)
    assert failed is not None and failed.state == "failed", log.read_text()
    assert failed.ready_runs == 2
