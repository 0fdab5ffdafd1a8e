"""approve, drift and the boot check with the real planner from a real endpoint file: the
host path with the real vLLM CPU venv (tests/tools/vllm_venv.sh), on a fake Genoa 2-socket
host root. Only systemd stays out (--no-start)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from epycd.approval.record import load_approval
from epycd.approval.state import endpoint_states_of
from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.plan.pipeline.build import PlanSources, plan_all
from epycd.plan.placement.reservations import Reservations
from epycd.render import render_for_plan
from tests.approval.conftest import ApprovalSandbox
from tests.health.realvllm import stock_vllm_executable, vllm_executable
from tests.hosts import CATALOGUE, write_host
from tests.machine import Serving, vllm_runs_zen_here
from tests.plan.conftest import write_model

pytestmark = pytest.mark.vllm
CONSENT = Serving(Path("/"), "Genoa", bf16=True, zen_platform=vllm_runs_zen_here()).consent_args
"""What approving on the fake Genoa host needs with this machine's vLLM (tests/machine.py)."""

NO_LISTENERS = PlanSources(listeners={})
"""Plan as if no port listened on this machine."""


def real_epycctl(
    env: ApprovalSandbox, *args: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """The product with its own planner (not the hand-made plans of `env.epycctl`)."""
    return env.epycctl(*args, module="epycd", env=extra)


def test_approve_drift_and_boot_check_with_the_real_planner(env: ApprovalSandbox) -> None:
    model = write_model(env.tmp / "models" / "qwen3")
    endpoint = env.settings.config_dir / "chat.toml"
    endpoint.write_text(f'model = "{model}"\nruntime = "host"\nvllm = "{vllm_executable()}"\n')

    done = real_epycctl(env, "approve", "chat", "--yes", "--no-start", *CONSENT)
    assert done.returncode == 0, done.stdout + done.stderr
    approval = load_approval(env.settings, "chat")
    assert approval is not None
    service = Path(approval.units["epyc-llm-chat.service"].path)
    assert service.parent == env.settings.unit_dir
    assert "CPUAffinity=0-95" in service.read_text()

    settings = env.settings
    host = env.host()
    [state] = endpoint_states_of(
        settings, plan_all(settings, host, render=render_for_plan, sources=NO_LISTENERS)
    )
    assert state.state == "approved", state.reasons

    endpoint.write_text(endpoint.read_text() + "max_model_len = 2048\n")
    [state] = endpoint_states_of(
        settings, plan_all(settings, host, render=render_for_plan, sources=NO_LISTENERS)
    )
    assert state.state == "changed-needs-approval"
    assert '-  "max_model_len": 4096' in state.plan_diff
    assert '+  "max_model_len": 2048' in state.plan_diff
    assert "+ExecStart=" in state.units_diff and "--max-model-len 2048" in state.units_diff
    assert "--max-model-len 4096" in service.read_text()  # untouched until approved

    ok = env.epycctl("chat", module="epycd.approval.check")
    assert ok.returncode == 0, ok.stderr
    smaller = write_host(
        env.tmp / "smaller", replace(CATALOGUE["genoa-9654-2s-nps1"], cores_per_socket=64)
    )
    refused = env.epycctl("chat", module="epycd.approval.check", EPYCD_HOST_ROOT=str(smaller))
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert "socket 0 physical cores 96 -> 64" in refused.stderr


def approved_chat(env: ApprovalSandbox) -> Path:
    """A host-path endpoint `chat` for a local model, approved with --no-start; its model."""
    model = write_model(env.tmp / "models" / "qwen3")
    (env.settings.config_dir / "chat.toml").write_text(
        f'model = "{model}"\nruntime = "host"\nvllm = "{vllm_executable()}"\n'
    )
    done = real_epycctl(env, "approve", "chat", "--yes", "--no-start", *CONSENT)
    assert done.returncode == 0, done.stdout + done.stderr
    return model


def test_volatile_figures_are_not_drift_but_the_host_shape_is(env: ApprovalSandbox) -> None:
    """Free memory and load change what a plan made now would render, not the approval."""
    approved_chat(env)
    settings, host = env.settings, env.host()

    short = host.model_copy(deep=True)
    for node in short.nodes:  # an eighth free: the pool's cap falls below what 128 seqs need
        node.memory_available_bytes //= 8
    for sock in short.socket_topology:
        sock.memory_available_gb /= 8
    [replanned] = plan_all(settings, short, render=render_for_plan, sources=NO_LISTENERS)
    approval = load_approval(settings, "chat")
    assert approval is not None and replanned.plan is not None
    assert replanned.plan.decisions.kv_cache_gb < approval.plan.decisions.kv_cache_gb
    assert replanned.plan.fingerprint != approval.fingerprint
    [state] = endpoint_states_of(settings, [replanned])
    assert state.state == "approved", state.reasons

    fewer = env.host(
        write_host(env.tmp / "fewer", replace(CATALOGUE["genoa-9654-2s-nps1"], cores_per_socket=64))
    )
    [state] = endpoint_states_of(
        settings, plan_all(settings, fewer, render=render_for_plan, sources=NO_LISTENERS)
    )
    assert state.state == "changed-needs-approval"
    assert '-  "cpus": "0-95"' in state.plan_diff


def test_a_new_endpoint_file_does_not_move_an_approved_endpoint(env: ApprovalSandbox) -> None:
    model = write_model(env.tmp / "models" / "qwen3")
    body = f'model = "{model}"\nruntime = "host"\nvllm = "{vllm_executable()}"\n'
    config = env.settings.config_dir
    (config / "b.toml").write_text(body)
    done = real_epycctl(env, "approve", "b", "--yes", "--no-start", *CONSENT)
    assert done.returncode == 0, done.stdout + done.stderr
    approval = load_approval(env.settings, "b")
    assert approval is not None and approval.plan.decisions.socket == 0

    (config / "a.toml").write_text(body + "port = 8100\n")
    settings, host = env.settings, env.host()
    first = plan_all(settings, host, render=render_for_plan, sources=NO_LISTENERS)
    by_name = {r.endpoint: r for r in first}
    assert (
        by_name["a"].plan is not None and by_name["a"].plan.decisions.socket == 0
    )  # name order alone

    kept = plan_all(
        settings,
        host,
        render=render_for_plan,
        reservations=Reservations.of({"b": approval.plan}),
        sources=NO_LISTENERS,
    )
    by_name = {r.endpoint: r for r in kept}
    assert by_name["b"].plan is not None and by_name["b"].plan.decisions.socket == 0
    assert by_name["a"].plan is not None and by_name["a"].plan.decisions.socket == 1
    states = {s.endpoint: s.state for s in endpoint_states_of(settings, kept)}
    assert states == {"a": "pending-approval", "b": "approved"}

    shown = real_epycctl(env, "plan", "a", "--json")
    assert shown.returncode == 0, shown.stderr
    assert '"socket": 1' in shown.stdout


def test_memory_held_by_the_running_endpoint_is_not_drift(env: ApprovalSandbox) -> None:
    """A re-plan that does not fit only because memory is taken now keeps the approval."""
    model = approved_chat(env)
    settings, host = env.settings, env.host()

    full = host.model_copy(deep=True)
    for node in full.nodes:
        node.memory_available_bytes = 0
    for sock in full.socket_topology:
        sock.memory_available_gb = 0.0
    [unfit] = plan_all(settings, full, render=render_for_plan, sources=NO_LISTENERS)
    assert unfit.plan is None and "does not fit" in unfit.errors[0].text
    [state] = endpoint_states_of(settings, [unfit])
    assert state.state == "approved", state.reasons
    assert "memory free now" in state.reasons[0]

    (env.settings.config_dir / "chat.toml").write_text(
        f'model = "{model}"\nruntime = "host"\nvllm = "{vllm_executable()}"\nmax_model_len = 2048\n'
    )
    [edited] = plan_all(settings, full, render=render_for_plan, sources=NO_LISTENERS)
    assert edited.plan is None
    [state] = endpoint_states_of(settings, [edited])
    assert state.state == "changed-needs-approval"


def test_a_stock_host_vllm_on_a_zentorch_host_is_consent_not_a_dead_end(
    env: ApprovalSandbox,
) -> None:
    """The real vLLM with zentorch hidden runs CpuPlatform on any machine: on the fake
    Genoa, approve asks for consent, says what it costs and how to get zentorch, and with
    consent approves the stock path."""
    model = write_model(env.tmp / "models" / "qwen3")
    stock = stock_vllm_executable()
    (env.settings.config_dir / "plain.toml").write_text(
        f'model = "{model}"\nruntime = "host"\nvllm = "{stock}"\n'
    )
    refused = real_epycctl(env, "approve", "plain", "--yes", "--no-start")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "needs explicit consent" in refused.stderr
    assert "runs CpuPlatform, not the Zen platform" in refused.stderr
    assert "zentorch acceleration is off" in refused.stderr
    assert "--accept-unvalidated" in refused.stderr
    assert load_approval(env.settings, "plain") is None
    assert list(env.settings.unit_dir.iterdir()) == []

    done = real_epycctl(env, "approve", "plain", "--yes", "--no-start", "--accept-unvalidated")
    assert done.returncode == 0, done.stdout + done.stderr
    approval = load_approval(env.settings, "plain")
    assert approval is not None and approval.accepted_unvalidated
    server = approval.plan.decisions.first
    assert isinstance(server, VllmCpuServer)
    assert server.backend == "stock"
    service = Path(approval.units["epyc-llm-plain.service"].path).read_text()
    assert str(stock) in service
