"""quickstart with a host vLLM (the real CPU venv, probed for real), the real planner and the
real approval code, on a fake host root shaped like this machine; systemd stays out
(--no-start), except one fake `systemctl` for the start call, as tests/approval does."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from epycd.approval.record import load_approval
from epycd.approval.state import endpoint_states_of
from epycd.cli.quickstart import endpoint_document, existing_matches, model_argument
from epycd.errors import Refusal
from epycd.paths import endpoint_status_file
from epycd.plan.pipeline.build import PlanSources, plan_all
from epycd.render import render_for_plan
from epycd.spec import parse_endpoint
from epycd.supervisor import SupervisorStatus, write_status
from tests.health.realvllm import tiny_model
from tests.machine import Serving, vllm_runs_zen_here
from tests.quickstart.conftest import real_vllm
from tests.sandbox import CliSandbox

pytestmark = pytest.mark.vllm

NO_LISTENERS = PlanSources(listeners={})
"""Plan as if no port listened on this machine."""


def quickstart(sandbox: CliSandbox, *args: str, **extra: str) -> tuple[int, str, str]:
    """quickstart with the real vLLM on the fake Genoa host, with the consent that host and
    this machine's vLLM platform call for (the stock platform needs it: tests/machine.py)."""
    consent = Serving(Path("/"), "Genoa", bf16=True, zen_platform=vllm_runs_zen_here())
    done = sandbox.epycctl(
        "quickstart", "--vllm", str(real_vllm()), *consent.consent_args, *args, env=extra
    )
    return done.returncode, done.stdout, done.stderr


def test_offline_without_the_model_writes_nothing(sandbox: CliSandbox) -> None:
    """The default model (Qwen/Qwen3-0.6B) is not in this empty HF cache and the hub is off:
    the planner's own error, exit 1, nothing written."""
    sandbox.use_fake_host()
    code, out, err = quickstart(sandbox, "--yes")
    assert code == 1, out + err
    assert "Qwen/Qwen3-0.6B is not in the local cache" in out + err
    assert "hf download Qwen/Qwen3-0.6B" in out + err
    assert "epycctl quickstart --model /path/to/model" in err
    assert sandbox.written() == []


def test_writes_plans_approves_and_agrees_with_the_planner(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    model = tiny_model()
    code, out, err = quickstart(sandbox, "--model", str(model), "--yes", "--no-start")
    assert code == 0, out + err
    settings = sandbox.settings
    target = settings.config_dir / "default.toml"
    written = tomllib.loads(target.read_text())
    assert written == {"model": str(model), "runtime": "host", "vllm": str(real_vllm())}
    assert "Plan for endpoint default" in out and "Memory fit" in out
    assert f"wrote {target}" in out

    approval = load_approval(settings, "default")
    assert approval is not None
    service = Path(approval.units["epyc-llm-default.service"].path)
    assert service.parent == settings.unit_dir and "CPUAffinity=0-1" in service.read_text()
    assert f"fingerprint {approval.fingerprint}" in out

    host = settings.host_root
    from epycd.host.detect import detect_host

    facts = detect_host(host, probe_runtimes=False)
    [state] = endpoint_states_of(
        settings, plan_all(settings, facts, render=render_for_plan, sources=NO_LISTENERS)
    )
    assert state.state == "approved", state.reasons  # what was approved is what `plan` plans

    again = sandbox.epycctl("plan", "default", "--json")
    assert json.loads(again.stdout)["fingerprint"] == approval.fingerprint

    code, out, err = quickstart(sandbox, "--model", str(model), "--yes", "--no-start")
    assert code == 0, out + err  # the same file again: approved again, not refused
    assert f"wrote {target}" not in out


def test_refuses_to_overwrite_a_different_file(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    target = sandbox.settings.config_dir / "default.toml"
    mine = 'model = "Qwen/Qwen3-0.6B"\nmax_model_len = 1024\n'
    target.write_text(mine)
    code, out, err = quickstart(sandbox, "--model", str(tiny_model()), "--yes", "--no-start")
    assert code == 1, out + err
    assert f"{target}: exists with other content" in err
    assert "--name" in err and "epycctl approve default" in err
    assert target.read_text() == mine
    assert sandbox.written() == [target]


def test_another_name_leaves_the_other_file_alone(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    other = sandbox.settings.config_dir / "default.toml"
    other.write_text('model = "Qwen/Qwen3-0.6B"\n')
    code, out, err = quickstart(
        sandbox, "--model", str(tiny_model()), "--name", "tiny", "--yes", "--no-start"
    )
    assert code == 0, out + err
    assert (sandbox.settings.config_dir / "tiny.toml").is_file()
    assert load_approval(sandbox.settings, "tiny") is not None
    assert load_approval(sandbox.settings, "default") is None


def test_no_terminal_and_no_yes_writes_nothing(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    code, out, err = quickstart(sandbox, "--model", str(tiny_model()), "--no-start")
    assert code == 1, out + err
    assert "no terminal to ask on and no --yes" in err
    assert "Plan for endpoint default" in out
    assert sandbox.written() == []


def test_start_waits_and_hands_off(sandbox: CliSandbox) -> None:
    """systemctl (fake: systemd is not PID 1 here) says the unit started: the hand-off."""
    sandbox.use_fake_host()
    sandbox.install_fake_systemctl()
    code, out, err = quickstart(
        sandbox, "--model", str(tiny_model()), "--yes", FAKE_ACTIVE="active"
    )
    assert code == 0, out + err
    approval = load_approval(sandbox.settings, "default")
    assert approval is not None
    calls = sandbox.systemctl_calls()
    assert "daemon-reload" in calls
    assert "enable epyc-llm-default.service" in calls
    assert "restart epyc-llm-default.service" in calls
    port = approval.plan.decisions.port
    assert "default is ready." in out
    assert f"http://127.0.0.1:{port}/v1" in out
    assert re.search(r"Served model +default +\(the id in /v1/models\)", out)
    assert f"curl -s http://127.0.0.1:{port}/v1/chat/completions" in out
    assert "from openai import OpenAI" in out
    assert "epycctl stop default" in out
    assert "unit active" in out  # the progress line read the unit's state


def test_a_failed_start_reports_the_gate_phase(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    sandbox.install_fake_systemctl()
    status_file = endpoint_status_file(sandbox.settings.run_dir, "default")
    write_status(
        status_file,
        SupervisorStatus(
            state="failed",
            name="default",
            url="http://127.0.0.1:8000",
            model="default",
            phase="health",
            reason="server exited while loading",
            log_tail=["ValueError: the KV cache does not fit"],
        ),
    )
    code, out, err = quickstart(
        sandbox, "--model", str(tiny_model()), "--yes", FAKE_SYSTEMCTL_FAIL="restart"
    )
    assert code == 1, out + err
    assert "default did not become ready: failed in phase health" in err
    assert "ValueError: the KV cache does not fit" in err
    assert "epycctl logs default" in err


def test_document_parses_as_an_endpoint_file(tmp_path: Path) -> None:
    content = endpoint_document("/models/x", "host", "/opt/env/bin/vllm")
    result = parse_endpoint(tmp_path / "default.toml", content, precisions=["bfloat16"])
    assert result.ok and result.spec is not None
    assert result.spec.runtime == "host" and result.spec.vllm == "/opt/env/bin/vllm"
    container = endpoint_document("Qwen/Qwen3-0.6B", "podman", None)
    assert tomllib.loads(container.decode()) == {"model": "Qwen/Qwen3-0.6B"}


def test_existing_file_rules(tmp_path: Path) -> None:
    target = tmp_path / "default.toml"
    content = endpoint_document("Qwen/Qwen3-0.6B", "docker", None)
    assert existing_matches(target, content) is False
    target.write_bytes(content)
    assert existing_matches(target, content) is True
    target.write_text('model = "other"\n')
    with pytest.raises(Refusal, match="exists with other content"):
        existing_matches(target, content)


def test_model_argument(tmp_path: Path) -> None:
    assert model_argument("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert model_argument(str(tmp_path)) == str(tmp_path)
    (tmp_path / "m").mkdir()
    assert model_argument(str(tmp_path / "x" / ".." / "m")) == str(tmp_path / "m")


def test_a_hostile_model_argument_is_not_echoed_raw(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    code, out, err = quickstart(sandbox, "--model", "Qw\ren/\x1b]0;title\x07", "--yes")
    assert code in (1, 2), out + err
    assert "\\x1b]0;title\\x07" in out + err
    assert not any(char in out + err for char in "\r\x1b\x07"), out + err
    assert sandbox.written() == []
