"""`epycctl gateway approve` and `remove`, and the gateway's routes following the endpoints'
approvals and the keys (epycd.gateway.apply), in the approval sandbox with a systemctl that
records its calls (systemd is not PID 1 here). Debian's HAProxy checks every configuration
written."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.metrics.gateway import usage_url
from epycd.plan.endpoint import Plan
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.gateway.sandbox import gateway_env
from tests.render.test_balancer import haproxy_check
from tests.secrets import root_folder, write_secret

LISTEN = "127.0.0.1:18080"
UNIT = "epyc-llm-gateway.service"
CERT_ONLY = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    with gateway_env(tmp_path, monkeypatch) as sandbox:
        sandbox.install_fake_systemctl()
        sandbox.vars["EPYCD_GATEWAY_LISTEN"] = LISTEN
        yield sandbox


def plan_of(env: ApprovalSandbox, name: str, socket: int, **decided: object) -> Plan:
    plan = make_plan(name, env.host(), env.settings.config_dir, socket=socket, port=8000 + socket)
    decisions = plan.decisions.model_copy(update={"served_model_name": f"{name}-model", **decided})
    return plan.model_copy(update={"decisions": decisions})


def approve(env: ApprovalSandbox, *plans: Plan) -> None:
    env.set_plans(*plans)
    for plan in plans:
        done = env.epycctl("approve", plan.endpoint, "--yes")
        assert done.returncode == 0, done.stderr


def folder(env: ApprovalSandbox) -> Path:
    return env.settings.state_dir / "gateway" / "haproxy"


def routed(env: ApprovalSandbox) -> dict[str, str]:
    lines = (folder(env) / "models.map").read_text().splitlines()
    return dict(line.split() for line in lines)


def checked_by_haproxy(env: ApprovalSandbox, tmp_path: Path) -> None:
    """`haproxy -c` of the written configuration, with the credentials systemd would hand
    over at start."""
    stored = env.settings.state_dir / "gateway" / "endpoint-keys.map"
    (tmp_path / "endpoint-keys.map").write_text(stored.read_text())
    config = (folder(env) / "haproxy.cfg").read_text()
    done = haproxy_check(config.replace("${CREDENTIALS_DIRECTORY}", str(tmp_path)), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_approve_installs_the_unit_and_routes_of_the_approved_endpoints(
    env: ApprovalSandbox, tmp_path: Path
) -> None:
    approve(env, plan_of(env, "chat", 0), plan_of(env, "emb", 1))
    env.systemctl_log.write_text("")
    done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 0, done.stderr
    unit = env.settings.unit_dir / UNIT
    assert f"-f {folder(env)}/haproxy.cfg" in unit.read_text()
    assert routed(env) == {"chat-model": "endpoint-chat", "emb-model": "endpoint-emb"}
    assert f"bind {LISTEN}\n" in (folder(env) / "haproxy.cfg").read_text()
    assert env.systemctl_calls() == ["daemon-reload", f"enable {UNIT}", f"restart {UNIT}"]
    record = json.loads((env.settings.state_dir / "gateway" / "approval.json").read_text())
    assert record["listen"] == LISTEN and record["approver"]["user"] == "root"
    # epycd's /metrics reads the usage where the approved gateway serves it
    assert record["metrics_listen"] == "127.0.0.1:9465"
    assert usage_url(env.settings) == "http://127.0.0.1:9465/usage"
    checked_by_haproxy(env, tmp_path)


def test_routes_follow_each_endpoint_approval_and_removal_with_a_reload(
    env: ApprovalSandbox,
) -> None:
    approve(env, plan_of(env, "chat", 0))
    assert env.epycctl("gateway", "approve", "--yes").returncode == 0
    env.vars["FAKE_ACTIVE"] = "active"
    env.systemctl_log.write_text("")
    approve(env, plan_of(env, "chat", 0), plan_of(env, "emb", 1))
    assert routed(env) == {"chat-model": "endpoint-chat", "emb-model": "endpoint-emb"}
    assert f"reload {UNIT}" in env.systemctl_calls()
    assert f"restart {UNIT}" not in env.systemctl_calls()
    env.systemctl_log.write_text("")
    done = env.epycctl("remove", "chat", "--yes")
    assert done.returncode == 0 and "gateway: routes and keys reloaded" in done.stdout
    assert routed(env) == {"emb-model": "endpoint-emb"}
    assert f"reload {UNIT}" in env.systemctl_calls()


def test_a_key_added_or_revoked_is_in_the_gateway_at_once(env: ApprovalSandbox) -> None:
    approve(env, plan_of(env, "chat", 0))
    assert env.epycctl("gateway", "approve", "--yes").returncode == 0
    env.vars["FAKE_ACTIVE"] = "active"
    added = env.epycctl("gateway", "add-key", "alice")
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines()[-1].startswith("sk-epyc-")
    assert "gateway: routes and keys reloaded" in added.stdout
    keys_map = (folder(env) / "keys.map").read_text()
    assert keys_map.endswith(" alice\n")
    assert added.stdout.splitlines()[-1] not in keys_map
    assert env.epycctl("gateway", "revoke", "alice").returncode == 0
    assert (folder(env) / "keys.map").read_text() == ""


def test_an_endpoints_own_key_is_a_root_only_credential_and_a_new_one_restarts(
    env: ApprovalSandbox, tmp_path: Path
) -> None:
    with root_folder() as secrets:
        key = write_secret(secrets / "chat.key", "the-chat-key\n")
        approve(env, plan_of(env, "chat", 0, api_key_file=str(key)))
        assert env.epycctl("gateway", "approve", "--yes").returncode == 0
        stored = env.settings.state_dir / "gateway" / "endpoint-keys.map"
        assert stored.read_text() == "endpoint-chat the-chat-key\n"
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        unit = (env.settings.unit_dir / UNIT).read_text()
        assert f"LoadCredential=endpoint-keys.map:{stored}\n" in unit
        for name in (folder(env)).iterdir():
            assert "the-chat-key" not in name.read_text(), name
        checked_by_haproxy(env, tmp_path)
        env.vars["FAKE_ACTIVE"] = "active"
        env.systemctl_log.write_text("")
        write_secret(key, "a-new-key\n")
        approve(env, plan_of(env, "chat", 0, api_key_file=str(key)))
        assert f"restart {UNIT}" in env.systemctl_calls()


def test_an_endpoint_whose_key_file_others_can_read_is_left_out_alone(
    env: ApprovalSandbox,
) -> None:
    with root_folder() as secrets:
        key = write_secret(secrets / "chat.key", "the-chat-key\n")
        approve(env, plan_of(env, "chat", 0, api_key_file=str(key)), plan_of(env, "emb", 1))
        key.chmod(0o644)
        done = env.epycctl("gateway", "approve", "--yes")
        assert done.returncode == 0, done.stderr
        assert routed(env) == {"emb-model": "endpoint-emb"}


def test_no_address_or_an_unreadable_certificate_changes_nothing(env: ApprovalSandbox) -> None:
    approve(env, plan_of(env, "chat", 0))
    env.vars["EPYCD_GATEWAY_LISTEN"] = ""
    done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 2
    assert "epycd.conf: gateway_listen: no gateway address is set" in done.stderr
    env.vars["EPYCD_GATEWAY_LISTEN"] = LISTEN
    for metrics in ("127.0.0.1:18080", "0.0.0.0:18080"):
        env.vars["EPYCD_GATEWAY_METRICS_LISTEN"] = metrics
        done = env.epycctl("gateway", "approve", "--yes")
        assert done.returncode == 2
        assert "epycd.conf: gateway_metrics_listen: the gateway's metrics" in done.stderr
    env.vars["EPYCD_GATEWAY_METRICS_LISTEN"] = "127.0.0.1:18081"
    missing = env.settings.config_dir / "gateway.pem"
    env.vars["EPYCD_GATEWAY_TLS_CERT_FILE"] = str(missing)
    done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 2
    assert f"gateway_tls_cert_file: cannot read {missing}: No such file" in done.stderr
    with root_folder() as secrets:
        cert = write_secret(secrets / "gateway.pem", CERT_ONLY)
        env.vars["EPYCD_GATEWAY_TLS_CERT_FILE"] = str(cert)
        done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 2 and f"{cert} holds no PRIVATE KEY-----" in done.stderr
    assert not (env.settings.state_dir / "gateway").exists()
    assert not (env.settings.unit_dir / UNIT).exists()


def test_remove_stops_and_deletes_the_unit_and_keeps_the_keys(env: ApprovalSandbox) -> None:
    approve(env, plan_of(env, "chat", 0))
    assert env.epycctl("gateway", "approve", "--yes").returncode == 0
    assert env.epycctl("gateway", "add-key", "alice").returncode == 0
    done = env.epycctl("gateway", "remove", "--yes")
    assert done.returncode == 0, done.stderr
    assert not (env.settings.unit_dir / UNIT).exists()
    assert (env.settings.state_dir / "gateway" / "keys.json").exists()
    assert f"disable {UNIT}" in env.systemctl_calls()
    assert usage_url(env.settings) is None  # no gateway, no usage to read
    # an endpoint approved now does not bring back a gateway that was removed
    approve(env, plan_of(env, "emb", 1))
    assert not (env.settings.unit_dir / UNIT).exists()
