"""Text from a model file never forges a line: a newline in a GGUF file's
general.architecture or general.name, or in config.json's `architectures`, reaches the
daemon's log (its stderr, which is the journal under systemd), `epycctl status`, `epycctl
plan` and `epycctl check-model` escaped (`epycd.text.escaped`), so no line of their output
starts with the text after the newline. `--json` keeps the raw value: JSON escapes it."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.conftest import DaemonSandbox
from tests.health.notifysock import NotifySocket
from tests.llama.realllama import llama_server
from tests.model.gguf_files import GgufShape, write_gguf
from tests.plan.conftest import QWEN3_0_6B_CONFIG, write_model
from tests.sandbox import REPO

pytestmark = pytest.mark.vllm
FORGED = "epycd: chat: ready -> crash-loop"
"""A daemon line the model file's text would forge, were its newline to pass raw."""
INJECTED = "\n" + FORGED
SHOWN = "\\n" + FORGED
"""How the escaped text reads: the newline as `\\n`, on the line it belongs to."""
WAIT = 90.0


def forged_lines(output: str) -> list[str]:
    """The lines of `output` that start with the forged text: none may."""
    return [line for line in output.splitlines() if line.startswith(FORGED)]


def forged_endpoints(ws: DaemonSandbox) -> tuple[Path, Path]:
    """`hf`: a model folder whose config.json names an architecture with a newline, for
    vLLM; `gguf`: a GGUF file whose general.architecture and general.name have one, for
    llama.cpp. Returns (the folder, the file)."""
    config = QWEN3_0_6B_CONFIG | {"architectures": ["Qwen3ForCausalLM" + INJECTED]}
    folder = write_model(ws.tmp / "models" / "forged", config)
    gguf = ws.tmp / "models" / "forged.gguf"
    write_gguf(gguf, GgufShape(architecture="qwen2" + INJECTED, name="tiny" + INJECTED))
    dataclasses.replace(ws, model=folder).endpoint("hf", "socket = 0\n")
    (ws.settings.config_dir / "gguf.toml").write_text(
        f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\nmodel = "{gguf}"\nsocket = 1\n'
    )
    return folder, gguf


def daemon_output(ws: DaemonSandbox) -> str:
    """The real daemon's stderr (and stdout) from its start, through READY=1, to SIGTERM."""
    with NotifySocket(ws.tmp / "notify.sock") as sock:
        process = subprocess.Popen(
            [sys.executable, "-m", "epycd.daemon", "--poll-interval", "0.3",
             "--refresh-interval", "0.5", "--settle-timeout", "0"],
            env=ws.environ(NOTIFY_SOCKET=str(sock.path)),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            ready = sock.wait_for("READY=1", WAIT)
            assert ready is not None, sock.fields()
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=WAIT)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    assert process.returncode == 0, output
    return output


def test_the_daemon_logs_a_planning_refusal_of_model_text_on_one_line(
    ws: DaemonSandbox,
) -> None:
    forged_endpoints(ws)
    output = daemon_output(ws)
    assert forged_lines(output) == [], output
    refused = [line for line in output.splitlines() if line.startswith("hf: ")]
    assert refused and all(SHOWN in line for line in refused), output


def test_status_shows_model_text_escaped_and_its_json_keeps_it(ws: DaemonSandbox) -> None:
    forged_endpoints(ws)
    shown = ws.epycctl("status")
    assert shown.returncode == 0, shown.stderr
    assert forged_lines(shown.stdout + shown.stderr) == [], shown.stdout
    assert SHOWN in shown.stdout, shown.stdout
    raw = ws.epycctl("status", "--json")
    assert raw.returncode == 0, raw.stderr
    rows = {row["name"]: row for row in json.loads(raw.stdout)["endpoints"]}
    assert any(INJECTED in reason for reason in rows["hf"]["reasons"]), rows["hf"]


@pytest.mark.parametrize("name", ["hf", "gguf"])
def test_plan_shows_model_text_escaped(ws: DaemonSandbox, name: str) -> None:
    forged_endpoints(ws)
    shown = ws.epycctl("plan", name)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert forged_lines(shown.stdout + shown.stderr) == [], shown.stdout
    assert SHOWN in shown.stdout, shown.stdout
    raw = ws.epycctl("plan", name, "--json")
    assert raw.returncode == 1, raw.stderr
    errors = json.loads(raw.stdout)["errors"]
    # config.json's text is quoted as it is; a GGUF architecture is quoted by its repr
    assert any((INJECTED if name == "hf" else SHOWN) in error for error in errors), errors


def test_check_model_shows_model_text_escaped_and_its_json_keeps_it(
    ws: DaemonSandbox,
) -> None:
    folder, gguf = forged_endpoints(ws)
    for model, key in ((folder, "architectures"), (gguf, "architectures")):
        shown = ws.epycctl("check-model", str(model))
        assert shown.returncode == 1, shown.stdout + shown.stderr
        assert forged_lines(shown.stdout + shown.stderr) == [], shown.stdout
        assert SHOWN in shown.stdout, shown.stdout
        raw = ws.epycctl("check-model", str(model), "--json")
        data = json.loads(raw.stdout)
        assert any(INJECTED in value for value in data[key]), data[key]
    data = json.loads(ws.epycctl("check-model", str(gguf), "--json").stdout)
    assert data["gguf"]["name"] == "tiny" + INJECTED
    assert data["gguf"]["architecture"] == "qwen2" + INJECTED
