"""approve / drift / remove / refusal flows through the real `epycctl` (planner replaced by
hand-made plans until the tests can plan from endpoint files), all folders temporary."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from epycd.approval.record import load_approval, sha256_text
from epycd.approval.state import endpoint_states
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan


def unit_path(env: ApprovalSandbox, file_name: str) -> Path:
    folder = env.settings.quadlet_dir if file_name.endswith(".container") else env.settings.unit_dir
    return folder / file_name


def test_approve_no_start_writes_units_and_approval(env: ApprovalSandbox) -> None:
    plan = make_plan("chat", env.host(), env.settings.config_dir)
    env.set_plans(plan)

    done = env.epycctl("approve", "chat", "--yes", "--no-start")

    assert done.returncode == 0, done.stderr
    assert "VLLM_CPU_OMP_THREADS_BIND" in done.stdout  # the table and the units were shown
    service = unit_path(env, "epyc-llm-chat.service")
    assert service.read_text() == plan.units["epyc-llm-chat.service"]
    assert stat.S_IMODE(service.stat().st_mode) == 0o644
    approval = load_approval(env.settings, "chat")
    assert approval is not None
    assert approval.fingerprint == plan.fingerprint
    assert approval.approver.uid == os.geteuid()
    assert approval.units["epyc-llm-chat.service"].sha256 == sha256_text(service.read_text())
    assert approval.plan.decisions.cpus == plan.decisions.cpus
    assert approval.host_shape.socket(0) is not None
    assert approval.host_shape.socket(0).physical_cores == 96  # type: ignore[union-attr]
    assert env.systemctl_calls() == []
    leftovers = [p for p in env.tmp.rglob("*epycd-staged*")]
    assert leftovers == []
    assert not (env.settings.state_dir / "transactions" / "chat.json").exists()
    [state] = endpoint_states(env.settings, env.plans)
    assert state.state == "approved"


def test_approver_is_the_sudo_user(env: ApprovalSandbox) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    done = env.epycctl("approve", "chat", "--yes", "--no-start", SUDO_USER="alice", SUDO_UID="1234")
    assert done.returncode == 0, done.stderr
    approval = load_approval(env.settings, "chat")
    assert approval is not None
    assert (approval.approver.sudo_user, approval.approver.sudo_uid) == ("alice", 1234)
    assert "alice (uid 1234) via sudo" in done.stdout


def test_no_terminal_and_no_yes_is_no(env: ApprovalSandbox) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    done = env.epycctl("approve", "chat", "--no-start")
    assert done.returncode == 1
    assert "no terminal to ask on and no --yes" in done.stderr
    assert "Traceback" not in done.stderr
    assert load_approval(env.settings, "chat") is None
    assert list(env.settings.unit_dir.iterdir()) == []


def test_refusals_change_nothing(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    env.set_plans(
        make_plan("big", host, config, fits=False),
        make_plan("milan", host, config, port=8001, requires_confirmation=True),
        make_plan("broken", host, config, port=8002, errors=["socket 3 does not exist"]),
    )
    for name, words in [
        ("big", "does not fit"),
        ("milan", "needs explicit consent: stock vLLM path"),
        ("broken", "the plan has errors: socket 3 does not exist"),
        ("nosuch", "no such endpoint file"),
    ]:
        done = env.epycctl("approve", name, "--yes", "--no-start")
        assert done.returncode == (2 if name == "nosuch" else 1), (name, done.stderr)
        assert words in done.stderr, (name, done.stderr)
        assert "Traceback" not in done.stderr
    assert list(env.settings.unit_dir.iterdir()) == []
    assert not (env.settings.state_dir / "approvals").exists() or not list(
        (env.settings.state_dir / "approvals").glob("*.json")
    )

    done = env.epycctl("approve", "milan", "--yes", "--no-start", "--accept-unvalidated")
    assert done.returncode == 0, done.stderr
    approval = load_approval(env.settings, "milan")
    assert approval is not None and approval.accepted_unvalidated


def test_drift_then_reapproval(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    env.set_plans(make_plan("chat", host, config, port=8000))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    service = unit_path(env, "epyc-llm-chat.service")
    approved_text = service.read_text()

    changed = make_plan("chat", host, config, port=8100)
    env.set_plans(changed)
    [state] = endpoint_states(env.settings, env.plans)
    assert state.state == "changed-needs-approval"
    assert '-  "port": 8000' in state.plan_diff and '+  "port": 8100' in state.plan_diff
    assert "-ExecStart=/opt/vllm/bin/vllm serve /srv/models/tiny --port 8000" in state.units_diff
    assert "+ExecStart=/opt/vllm/bin/vllm serve /srv/models/tiny --port 8100" in state.units_diff
    assert '"socket_reason"' not in state.plan_diff  # volatile wording is not a change
    assert service.read_text() == approved_text  # nothing rewritten without approval

    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    assert "--port 8100" in service.read_text()
    [state] = endpoint_states(env.settings, env.plans)
    assert state.state == "approved"


def test_edited_unit_is_drift(env: ApprovalSandbox) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    service = unit_path(env, "epyc-llm-chat.service")
    service.write_text(service.read_text().replace("--port 8000", "--port 9999"))
    [state] = endpoint_states(env.settings, env.plans)
    assert state.state == "changed-needs-approval"
    assert "epyc-llm-chat.service was modified after approval" in " ".join(state.reasons)
    assert "+ExecStart=/opt/vllm/bin/vllm serve /srv/models/tiny --port 9999" in state.units_diff


def test_pending_and_orphaned(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    env.set_plans(make_plan("a", host, config), make_plan("b", host, config, socket=1, port=8001))
    assert env.epycctl("approve", "b", "--yes", "--no-start").returncode == 0
    states = {s.endpoint: s.state for s in endpoint_states(env.settings, env.plans)}
    assert states == {"a": "pending-approval", "b": "approved"}

    (config / "b.toml").unlink()
    del env.plans["b"]
    states = {s.endpoint: s.state for s in endpoint_states(env.settings, env.plans)}
    assert states == {"a": "pending-approval", "b": "orphaned"}


def test_a_damaged_approval_does_not_hide_the_others(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    env.set_plans(make_plan("a", host, config), make_plan("b", host, config, socket=1, port=8001))
    for name in ("a", "b"):
        assert env.epycctl("approve", name, "--yes", "--no-start").returncode == 0
    (env.settings.state_dir / "approvals" / "a.json").write_text("{not json")
    states = {s.endpoint: s for s in endpoint_states(env.settings, env.plans)}
    assert states["b"].state == "approved"
    assert states["a"].state == "damaged"
    assert "a.json" in states["a"].reasons[0] and "epycctl approve" in states["a"].reasons[0]


def test_reapproval_drops_units_the_new_plan_no_longer_has(env: ApprovalSandbox) -> None:
    host = env.host()
    config = env.settings.config_dir
    extra = {
        "epyc-llm-chat-warm.service": "[Service]\nExecStart=/bin/true\n",
        "epyc-llm-chat-warm.timer": "[Timer]\nOnBootSec=1min\n[Install]\nWantedBy=timers.target\n",
    }
    env.set_plans(make_plan("chat", host, config, extra_units=extra))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    timer = unit_path(env, "epyc-llm-chat-warm.timer")
    assert timer.exists()
    [state] = endpoint_states(env.settings, env.plans)  # its extra unit is no orphan
    assert state.state == "approved"
    env.set_plans(make_plan("chat", host, config))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    assert not timer.exists()
    assert not unit_path(env, "epyc-llm-chat-warm.service").exists()
    approval = load_approval(env.settings, "chat")
    assert approval is not None and list(approval.units) == ["epyc-llm-chat.service"]


def test_approve_starts_through_systemctl_host_path(env: ApprovalSandbox) -> None:
    env.install_fake_systemctl()
    host, config = env.host(), env.settings.config_dir
    timer = {
        "epyc-llm-chat-warm.timer": "[Timer]\nOnBootSec=1min\n[Install]\nWantedBy=timers.target\n"
    }
    env.set_plans(make_plan("chat", host, config, extra_units=timer))
    done = env.epycctl("approve", "chat", "--yes")
    assert done.returncode == 0, done.stderr
    assert env.systemctl_calls() == [
        "daemon-reload",
        "enable epyc-llm-chat.service epyc-llm-chat-warm.timer",
        "restart epyc-llm-chat.service",
    ]
    env.systemctl_log.unlink()

    # the same units again: a running endpoint is left alone
    assert env.epycctl("approve", "chat", "--yes").returncode == 0
    assert env.systemctl_calls()[-1] == "start epyc-llm-chat.service"
    env.systemctl_log.unlink()

    # changed units, one dropped: disable it before its file goes, restart to apply
    env.set_plans(make_plan("chat", host, config, port=8100))
    assert env.epycctl("approve", "chat", "--yes", FAKE_ENABLED="enabled").returncode == 0
    assert env.systemctl_calls() == [
        "is-enabled epyc-llm-chat-warm.timer",
        "disable epyc-llm-chat-warm.timer",
        "daemon-reload",
        "enable epyc-llm-chat.service",
        "restart epyc-llm-chat.service",
    ]
    assert not (env.settings.unit_dir / "epyc-llm-chat-warm.timer").exists()


def test_approve_quadlet_pulls_and_starts_the_generated_service(env: ApprovalSandbox) -> None:
    env.install_fake_systemctl()
    pulls = env.tmp / "pulls.log"
    podman = env.bin_dir / "podman"
    podman.write_text(
        f'#!/bin/sh\necho "$*" >> {pulls}\necho "Writing manifest to image destination"\n'
    )
    podman.chmod(0o755)
    plan = make_plan("chat", env.host(), env.settings.config_dir, runtime="podman")
    env.set_plans(plan)
    done = env.epycctl("approve", "chat", "--yes")
    assert done.returncode == 0, done.stderr
    assert pulls.read_text().splitlines() == [
        f"pull {plan.decisions.image}",
        f"image inspect --format {{{{.Id}}}} {plan.decisions.image}",  # the digest for the record
    ]
    assert (env.settings.quadlet_dir / "epyc-llm-chat.container").exists()
    assert env.systemctl_calls() == ["daemon-reload", "restart epyc-llm-chat.service"]


def test_failed_pull_installs_nothing(env: ApprovalSandbox) -> None:
    podman = env.bin_dir / "podman"
    podman.write_text(
        "#!/bin/sh\necho 'Error: initializing source: connection refused' >&2\nexit 125\n"
    )
    podman.chmod(0o755)
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir, runtime="podman"))
    done = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert done.returncode == 1
    assert "podman pull docker.io/amdih/zendnn_zentorch:test` failed (exit 125)" in done.stderr
    assert load_approval(env.settings, "chat") is None
    assert list(env.settings.quadlet_dir.iterdir()) == []
    assert env.epycctl("approve", "chat", "--yes", "--no-start", "--no-pull").returncode == 0


def test_systemctl_failure_is_one_clear_line(env: ApprovalSandbox) -> None:
    env.install_fake_systemctl()
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    done = env.epycctl("approve", "chat", "--yes", FAKE_SYSTEMCTL_FAIL="restart")
    assert done.returncode == 1
    assert (
        "`systemctl restart epyc-llm-chat.service` failed (exit 5): Failed to restart"
        in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_remove_stops_disables_deletes(env: ApprovalSandbox) -> None:
    env.install_fake_systemctl()
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    service = unit_path(env, "epyc-llm-chat.service")

    refused = env.epycctl("remove", "chat")
    assert refused.returncode == 1 and service.exists()

    done = env.epycctl(
        "remove", "chat", "--yes", "--json", FAKE_ACTIVE="active", FAKE_ENABLED="enabled"
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["endpoint"], answer["action"], answer["result"]) == ("chat", "remove", "removed")
    assert answer["removed"] == [str(service)]
    assert answer["steps"][-1] == "systemctl daemon-reload"
    assert not service.exists()
    assert load_approval(env.settings, "chat") is None
    assert env.systemctl_calls() == [
        "is-active epyc-llm-chat.service",
        "stop epyc-llm-chat.service",
        "is-enabled epyc-llm-chat.service",
        "disable epyc-llm-chat.service",
        "daemon-reload",
    ]
    assert endpoint_states(env.settings, env.plans)[0].state == "pending-approval"

    again = env.epycctl("remove", "chat", "--yes", "--no-stop")
    assert again.returncode == 2 and "nothing to remove" in again.stderr


def test_remove_says_the_endpoint_file_stays_and_holds_its_socket(env: ApprovalSandbox) -> None:
    env.install_fake_systemctl()
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir))
    assert env.epycctl("approve", "chat", "--yes", "--no-start").returncode == 0
    done = env.epycctl("remove", "chat", "--yes")
    assert done.returncode == 0, done.stderr
    file = env.settings.config_dir / "chat.toml"
    assert file.is_file()
    assert f"its endpoint file {file} stays" in done.stdout, done.stdout
    assert "delete the file to free it" in done.stdout


def test_remove_orphan_without_systemd(env: ApprovalSandbox) -> None:
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir, runtime="podman"))
    assert env.epycctl("approve", "chat", "--yes", "--no-start", "--no-pull").returncode == 0
    (env.settings.config_dir / "chat.toml").unlink()
    env.set_plans()
    assert endpoint_states(env.settings, {})[0].state == "orphaned"
    done = env.epycctl("remove", "chat", "--yes", "--no-stop")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("removed chat"), done.stdout
    assert list(env.settings.quadlet_dir.iterdir()) == []
    assert endpoint_states(env.settings, {}) == []
