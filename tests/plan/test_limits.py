"""Limits of what the CLI takes and echoes: endpoint files of a sane size, numeric options
in their range, and no control character printed raw to a terminal. The real `epycctl` in
a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.hosts import make_host
from tests.plan.conftest import PlanWorkspace
from tests.sandbox import REPO, run_python

RAW_CONTROLS = ("\x07", "\x08", "\r", "\x1b")


def epycctl(ws: PlanWorkspace, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPYCD_")}
    env |= {
        "EPYCD_CONFIG_DIR": str(ws.config_dir),
        "EPYCD_STATE_DIR": str(ws.settings.state_dir),
        "EPYCD_RUN_DIR": str(ws.settings.run_dir),
        "EPYCD_UNIT_DIR": str(ws.settings.unit_dir),
        "EPYCD_QUADLET_DIR": str(ws.settings.quadlet_dir),
        "EPYCD_HOST_ROOT": str(make_host(ws.tmp / "hosts", "genoa-9654-2s-nps1")),
        "HF_HOME": str(ws.hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }
    return run_python(["-m", "epycd", *args], env=env)


def test_an_oversized_endpoint_file_is_refused_unread(ws: PlanWorkspace) -> None:
    secret = "s3cr3t-" * 10_000
    big = ws.endpoint("big", f'served_model_name = "{secret}"\n')
    ws.endpoint("chat")
    done = epycctl(ws, "plan", "big", "--json")
    assert done.returncode == 2, done.stderr
    [error] = json.loads(done.stdout)["errors"]
    assert error.startswith(f"{big}: is larger than 64 KiB")
    assert "s3cr3t" not in done.stdout + done.stderr
    status = epycctl(ws, "status", "--json")
    assert status.returncode == 0, status.stderr
    states = {e["name"]: e["state"] for e in json.loads(status.stdout)["endpoints"]}
    assert states["chat"] == "pending-approval" and "s3cr3t" not in status.stdout


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["plan", "chat", "--sample-seconds", "nan"], "--sample-seconds"),
        (["plan", "chat", "--sample-seconds", "inf"], "--sample-seconds"),
        (["plan", "chat", "--sample-seconds", "-1"], "--sample-seconds"),
        (["plan", "chat", "--sample-seconds", "1e9"], "--sample-seconds"),
        (["detect", "--load-sample", "nan"], "--load-sample"),
        (["detect", "--load-sample", "86400"], "--load-sample"),
        (["estimate", "m/m", "--socket-gb", "inf"], "--socket-gb"),
        (["estimate", "m/m", "--socket-gb", "nan"], "--socket-gb"),
        (["estimate", "m/m", "--max-model-len", "1000000000000"], "--max-model-len"),
        (["estimate", "m/m", "--max-num-seqs", "99999999"], "--max-num-seqs"),
        (["logs", "chat", "--lines", "99999999999"], "--lines"),
    ],
)
def test_numeric_options_check_their_range(ws: PlanWorkspace, argv: list[str], option: str) -> None:
    ws.endpoint("chat")
    done = epycctl(ws, *argv)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"Invalid value for '{option}'" in done.stderr or f"'{option}'" in done.stderr
    assert "Traceback" not in done.stderr


def test_no_control_character_reaches_the_terminal_raw(ws: PlanWorkspace) -> None:
    ws.endpoint("chat", '[env]\n"\\u0007\\u0008x" = "y"\n')
    for argv in (["plan", "chat"], ["status"], ["approve", "chat", "--yes"]):
        done = epycctl(ws, *argv)
        assert done.returncode in (0, 1, 2), done.stderr
        shown = done.stdout + done.stderr
        assert "env.\\x07\\x08x" in shown, shown
        assert not any(char in shown for char in RAW_CONTROLS), shown
    hostile = epycctl(ws, "check-model", "Qw\ren/\x1b]0;title\x07")
    assert hostile.returncode == 2
    assert not any(char in hostile.stderr for char in RAW_CONTROLS), hostile.stderr
    assert "\\x1b]0;title\\x07" in hostile.stderr


def test_a_hostile_cpu_name_is_escaped_in_detect(ws: PlanWorkspace) -> None:
    root = make_host(ws.tmp / "hostile", "genoa-9654-2s-nps1")
    cpuinfo = root / "proc" / "cpuinfo"
    cpuinfo.write_text(
        re.sub(
            r"(?m)^model name\t: .*$",
            "model name\t: AMD EPYC \x1b]0;t\x07\x08",
            cpuinfo.read_text(),
        )
    )
    done = epycctl(ws, "detect", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert "AMD EPYC \\x1b]0;t\\x07\\x08" in done.stdout
    assert not any(char in done.stdout for char in RAW_CONTROLS)
