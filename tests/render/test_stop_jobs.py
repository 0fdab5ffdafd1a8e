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
