"""Special files through the real commands: one endpoint's api_key_file, hf_token_file or
chat_template is a FIFO, /dev/zero through a symlink, a folder or over its cap. `plan`, `status`
and `approve` (real planner, real CLI processes) return at once (a blocked read fails them by
the subprocess timeout), with exit 2 naming that endpoint's file and key, no traceback; the
healthy endpoint is planned, shown and approved; the daemon keeps reporting it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epycd.readfile import SECRET_MAX_BYTES, TEMPLATE_MAX_BYTES
from tests.daemon.conftest import DaemonSandbox
from tests.machine import consent_on
from tests.sandbox import REPO, run_python
from tests.secrets import root_folder

pytestmark = pytest.mark.vllm
COMMAND_SECONDS = 60
"""`plan` of two endpoints takes a few seconds here; a blocked read never returns."""
CAPS = {"api_key_file": SECRET_MAX_BYTES, "hf_token_file": SECRET_MAX_BYTES,
        "chat_template": TEMPLATE_MAX_BYTES}  # fmt: skip
WORDS = {"fifo": "FIFO", "symlink-to-dev-zero": "character device", "folder": "folder",
         "over-the-cap": "larger than"}  # fmt: skip


def make_special(path: Path, kind: str, cap: int) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        with path.open("wb") as file:
            file.truncate(cap + 1)
        path.chmod(0o600)


def cli(ws: DaemonSandbox, *args: str) -> subprocess.CompletedProcess[str]:
    done = run_python(["-m", "epycd", *args], env=ws.environ(), timeout=COMMAND_SECONDS)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


@pytest.mark.parametrize("kind", list(WORDS))
@pytest.mark.parametrize("key", list(CAPS))
def test_plan_status_and_approve_report_the_special_file_and_serve_the_other(
    ws: DaemonSandbox, key: str, kind: str
) -> None:
    with root_folder() as secrets:
        special = secrets / "special"
        make_special(special, kind, CAPS[key])
        ws.endpoint("good", "socket = 0\n")
        config = ws.endpoint("bad", f'socket = 1\n{key} = "{special}"\n')

        bad = cli(ws, "plan", "bad")
        assert bad.returncode == 2, bad.stdout + bad.stderr
        said = bad.stdout + bad.stderr
        assert str(config) in said and key in said and WORDS[kind] in said, said
        good = cli(ws, "plan", "good", "--json")
        assert good.returncode == 0, good.stdout + good.stderr
        assert json.loads(good.stdout)["errors"] == []

        status = cli(ws, "status", "--json")
        assert status.returncode == 0, status.stderr
        rows = {row["name"]: row for row in json.loads(status.stdout)["endpoints"]}
        assert rows["good"]["state"] == "pending-approval" and rows["good"]["port"]
        assert any(str(config) in r and key in r for r in rows["bad"]["reasons"])

        refused = cli(ws, "approve", "bad", "--yes", "--no-start")
        assert refused.returncode == 2 and str(config) in refused.stdout + refused.stderr
        # the fake host is a Genoa: the real vLLM runs stock (consent) where it has no zentorch
        approved = cli(ws, "approve", "good", "--yes", "--no-start", *consent_on("Genoa"))
        assert approved.returncode == 0, approved.stdout + approved.stderr


def test_the_daemon_keeps_reporting_the_healthy_endpoint_beside_a_fifo(ws: DaemonSandbox) -> None:
    with root_folder() as secrets:
        fifo = secrets / "key"
        os.mkfifo(fifo)
        ws.endpoint("good", "socket = 0\n")
        ws.approve("good")
        ws.set_unit("epyc-llm-good.service", "inactive")
        ws.endpoint("bad", f'socket = 1\napi_key_file = "{fifo}"\n')
        status_file = ws.settings.run_dir / "status.json"
        process = subprocess.Popen(
            [sys.executable, "-m", "epycd.daemon", "--settle-timeout", "0"],
            env=ws.environ(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            rows: dict[str, dict[str, object]] = {}
            deadline = time.monotonic() + COMMAND_SECONDS
            while time.monotonic() < deadline and "bad" not in rows:
                time.sleep(0.3)
                try:
                    data = json.loads(status_file.read_text())
                except (OSError, ValueError):
                    continue
                rows = {row["name"]: row for row in data["endpoints"]}
            assert rows.get("good", {}).get("state") in ("approved", "starting", "ready"), rows
            assert any(str(fifo) in str(r) for r in rows["bad"]["reasons"])  # type: ignore[attr-defined]
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = process.communicate(timeout=COMMAND_SECONDS)
        assert "Traceback" not in err, err
        assert process.returncode == 0, err
