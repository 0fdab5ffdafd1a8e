"""What the crash recorder asks systemd (`epycd.systemd.unit_jobs`), checked against a real
systemd 252 manager: in the ExecStopPost= of a run that systemd was asked to end (`systemctl
stop`, `systemctl restart`) the unit's stop or restart job is running; in that of a run that
ended by itself (its main process killed, or exiting 0) there is none."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from epycd.approval.crashloop import read_crash_record
from epycd.paths import endpoint_status_file
from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.test_crashloop import UNIT, approve, boot_check
from tests.health.realvllm import free_port
from tests.health.supervising import supervisor_argv
from tests.render.manager import UserManager

REPO = Path(__file__).resolve().parents[2]
PROBE = """\
import json, os, sys
sys.path.insert(0, {repo!r})
from epycd.approval.crashloop import asked_to_stop
from epycd.systemd import unit_jobs
with open({out!r}, "a") as out:
    out.write(json.dumps({{
        "result": os.environ.get("SERVICE_RESULT"),
        "jobs": unit_jobs("probe.service", user=True),
        "asked": asked_to_stop("probe", os.environ, unit_jobs),
    }}) + "\\n")
"""


def unit(tmp_path: Path, main: str) -> tuple[str, Path]:
    out = tmp_path / "seen.jsonl"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(repo=str(REPO), out=str(out)))
    text = f"[Service]\nExecStart={main}\nExecStopPost={sys.executable} {probe}\nRestart=no\n"
    return text, out


def ends(out: Path, count: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines() if out.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"ExecStopPost= ran {len(lines)} times, not {count}")


def main_pid(manager: UserManager) -> int:
    return int(manager.systemctl("show", "-p", "MainPID", "--value", "probe.service"))


def test_the_recorder_tells_a_stop_systemd_was_asked_for_from_a_run_that_ended(
    manager: UserManager, tmp_path: Path
) -> None:
    text, out = unit(tmp_path, "/bin/sleep 300")
    manager.install({"probe.service": text})
    manager.systemctl("start", "probe.service")
    manager.systemctl("stop", "probe.service")
    manager.systemctl("start", "probe.service")
    manager.systemctl("restart", "probe.service")
    os.kill(main_pid(manager), signal.SIGKILL)
    seen = ends(out, 3)
    assert seen[0] == {"result": "success", "jobs": ["stop"], "asked": True}
    assert seen[1] == {"result": "success", "jobs": ["restart"], "asked": True}
    assert seen[2] == {"result": "signal", "jobs": [], "asked": False}


def test_a_clean_exit_by_itself_has_no_stop_job(manager: UserManager, tmp_path: Path) -> None:
    text, out = unit(tmp_path, "/bin/sh -c 'sleep 0.5; exit 0'")
    manager.install({"probe.service": text})
    manager.systemctl("start", "probe.service")
    [seen] = ends(out, 1)
    assert seen == {"result": "success", "jobs": [], "asked": False}


STUB = REPO / "tests" / "health" / "stub_server.py"


def supervised_unit(env: ApprovalSandbox, *stub_options: str) -> str:
    """The endpoint `chat`'s unit as the product writes its healing lines, its server the
    stand-in (tests/health/stub_server.py) under the real supervisor, its ExecStopPost= the
    real crash recorder on the sandbox's state."""
    port = free_port()
    status = endpoint_status_file(env.settings.run_dir, "chat")
    server = [sys.executable, str(STUB), str(port), "tiny", *stub_options]
    supervisor = supervisor_argv(
        url=f"http://127.0.0.1:{port}", model="tiny", status_file=status, server=server
    )
    environment = env.tmp / "unit.env"
    environment.write_text("".join(f"{k}={v}\n" for k, v in env.environ().items()))
    recorder = [sys.executable, "-m", "epycd.approval.crashloop", "chat", "--unit", UNIT]
    return (
        "[Service]\n"
        "Type=notify\nNotifyAccess=main\n"
        f"EnvironmentFile={environment}\nWorkingDirectory={REPO}\n"
        f"ExecStart={' '.join(supervisor)}\n"
        f"ExecStopPost={' '.join(recorder)}\n"
        "Restart=no\nTimeoutStopSec=20\n"
    )


def test_stops_of_a_server_that_exits_1_on_sigterm_make_no_crash_loop(
    manager: UserManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cause of a crash loop after two real faults: three `systemctl stop`s (a reboot's
    stop included) of a server that exits 1 when it is stopped were three failed runs, and
    with a kill and a hang later the third fault found the verdict. Under a real systemd
    manager, the real supervisor and the real recorder: no failure at all. A run that ended
    by itself, with status 0, is one."""
    env = make_env(tmp_path / "sandbox", monkeypatch)
    approve(env)
    manager.install({f"{UNIT}.service": supervised_unit(env, "--exit-on-term", "1")})
    for _stop in range(3):
        manager.systemctl("start", f"{UNIT}.service")
        manager.systemctl("stop", f"{UNIT}.service")
        said = manager.systemctl("show", "-p", "Result", "--value", f"{UNIT}.service")
        assert said.strip() == "exit-code", "the server's stop status is the unit's"
    assert read_crash_record(env.settings, UNIT) is None, "a stop that systemd was asked for"
    assert boot_check(env).returncode == 0

    manager.install({f"{UNIT}.service": supervised_unit(env, "--exit-after", "2", "0")})
    manager.systemctl("start", f"{UNIT}.service")
    deadline = time.monotonic() + 30
    while (record := read_crash_record(env.settings, UNIT)) is None:
        assert time.monotonic() < deadline, "the run that ended by itself was not recorded"
        time.sleep(0.2)
    [failure] = record.failures
    assert failure.how == "exit-code 1", failure
    assert failure.reason.startswith("failed in phase serving: server exited with status 0")
