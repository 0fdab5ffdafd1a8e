"""The gateway's inputs checked the way the gateway reads them (issue 71): a change of keys
reaches the installed gateway whatever epycd.conf says now, or is refused; HAProxy itself
checks every candidate (real openssl-made certificates, the test cache's real HAProxy); a
certificate renewed at its path restarts the gateway; the key store's names are anchored
and the store is root's alone; no value reaches haproxy.cfg or a map but by its anchored
rule."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from epycd.errors import InputError
from epycd.gateway.haproxy import gateway_files
from epycd.gateway.keys import ClientKey, KeyStore
from epycd.gateway.routes import Route
from epycd.gateway.values import ADDRESS, PATH, checked
from epycd.plan.endpoint import Plan
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.gateway.sandbox import gateway_env
from tests.secrets import root_folder, write_secret

LISTEN = "127.0.0.1:18080"
UNIT = "epyc-llm-gateway.service"
NOBODY = 65534


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    with gateway_env(tmp_path, monkeypatch) as sandbox:
        sandbox.install_fake_systemctl()
        sandbox.vars["EPYCD_GATEWAY_LISTEN"] = LISTEN
        yield sandbox


def gateway_folder(env: ApprovalSandbox) -> Path:
    return env.settings.state_dir / "gateway"


def approved_gateway(env: ApprovalSandbox) -> None:
    """Endpoint `chat` approved, the gateway approved and running."""
    plan: Plan = make_plan("chat", env.host(), env.settings.config_dir, socket=0, port=8000)
    decisions = plan.decisions.model_copy(update={"served_model_name": "chat-model"})
    env.set_plans(plan.model_copy(update={"decisions": decisions}))
    done = env.epycctl("approve", "chat", "--yes")
    assert done.returncode == 0, done.stderr
    done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 0, done.stderr
    env.vars["FAKE_ACTIVE"] = "active"


def keys_map(env: ApprovalSandbox) -> str:
    return (gateway_folder(env) / "haproxy" / "keys.map").read_text()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and its key (no passphrase), made by openssl."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
            "-out", str(cert), "-days", "2", "-subj", "/CN=localhost")  # fmt: skip
    return cert, key


def pem(folder: Path, name: str, cert: Path, key: Path) -> Path:
    """One PEM file of `cert` and `key`, root's, mode 0600, as the gateway takes it."""
    return write_secret(folder / f"{name}.pem", cert.read_text() + key.read_text())


# 4. A change of keys never silently misses the installed gateway


def test_a_revoked_key_leaves_the_installed_gateway_when_the_settings_no_longer_name_it(
    env: ApprovalSandbox,
) -> None:
    approved_gateway(env)
    assert env.epycctl("gateway", "add-key", "alice").returncode == 0
    assert keys_map(env).endswith(" alice\n")
    env.vars["EPYCD_GATEWAY_LISTEN"] = ""  # epycd.conf no longer names it; its unit stays
    env.systemctl_log.write_text("")
    done = env.epycctl("gateway", "revoke", "alice")
    assert done.returncode == 0, done.stderr
    assert keys_map(env) == ""
    assert f"reload {UNIT}" in env.systemctl_calls()
    assert "gateway_listen is no longer set" in done.stdout
    assert "`epycctl gateway remove` takes it away" in done.stdout
    # the approved address stays in its configuration
    assert f"bind {LISTEN}\n" in (gateway_folder(env) / "haproxy" / "haproxy.cfg").read_text()


def test_an_endpoint_approved_while_the_settings_no_longer_name_the_gateway_is_routed(
    env: ApprovalSandbox,
) -> None:
    approved_gateway(env)
    env.vars["EPYCD_GATEWAY_LISTEN"] = ""
    chat = make_plan("chat", env.host(), env.settings.config_dir, socket=0, port=8000)
    emb = make_plan("emb", env.host(), env.settings.config_dir, socket=1, port=8001)
    chat = chat.model_copy(
        update={"decisions": chat.decisions.model_copy(update={"served_model_name": "chat-model"})}
    )
    emb = emb.model_copy(
        update={"decisions": emb.decisions.model_copy(update={"served_model_name": "emb-model"})}
    )
    env.set_plans(chat, emb)
    env.systemctl_log.write_text("")
    done = env.epycctl("approve", "emb", "--yes")
    assert done.returncode == 0, done.stderr
    models = (gateway_folder(env) / "haproxy" / "models.map").read_text()
    assert "emb-model endpoint-emb\n" in models
    assert f"reload {UNIT}" in env.systemctl_calls()


def test_a_unit_without_its_approval_record_refuses_a_key_change_and_changes_nothing(
    env: ApprovalSandbox,
) -> None:
    approved_gateway(env)
    assert env.epycctl("gateway", "add-key", "alice").returncode == 0
    store = (gateway_folder(env) / "keys.json").read_text()
    (gateway_folder(env) / "approval.json").unlink()
    env.systemctl_log.write_text("")
    done = env.epycctl("gateway", "revoke", "alice")
    assert done.returncode == 1, done.stdout
    assert "the gateway's approval record" in done.stderr and "is missing" in done.stderr
    assert "`epycctl gateway approve`" in done.stderr
    assert "revoked" not in done.stdout and "Traceback" not in done.stderr
    assert (gateway_folder(env) / "keys.json").read_text() == store
    assert keys_map(env).endswith(" alice\n")
    assert env.systemctl_calls() == []


# 5. HAProxy itself checks every candidate


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("mismatched", "inconsistencies between private key and certificate"),
        ("passphrase", "No Private Key found"),
    ],
)
def test_a_certificate_haproxy_cannot_load_is_refused_with_its_line_and_the_gateway_untouched(
    env: ApprovalSandbox, kind: str, says: str
) -> None:
    with root_folder() as secrets:
        cert, key = certificate(secrets, "a")
        good = pem(secrets, "gateway", cert, key)
        env.vars["EPYCD_GATEWAY_TLS_CERT_FILE"] = str(good)
        approved_gateway(env)
        installed = {p: p.read_bytes() for p in gateway_folder(env).rglob("*") if p.is_file()}
        unit = (env.settings.unit_dir / UNIT).read_text()
        if kind == "mismatched":
            _, other_key = certificate(secrets, "b")
            bad = pem(secrets, "bad", cert, other_key)
        else:
            locked = secrets / "locked.key"
            openssl("pkey", "-in", str(key), "-aes256", "-passout", "pass:secret",
                    "-out", str(locked))  # fmt: skip
            bad = pem(secrets, "bad", cert, locked)
        env.vars["EPYCD_GATEWAY_TLS_CERT_FILE"] = str(bad)
        env.systemctl_log.write_text("")
        done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "HAProxy refuses the gateway's new configuration" in done.stderr
    assert says in done.stderr and str(bad) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert env.systemctl_calls() == []
    assert (env.settings.unit_dir / UNIT).read_text() == unit
    after = {p: p.read_bytes() for p in gateway_folder(env).rglob("*") if p.is_file()}
    assert after == installed


# 6. A certificate renewed at its path is applied


def test_a_certificate_renewed_at_its_path_restarts_the_gateway_with_the_new_one(
    env: ApprovalSandbox,
) -> None:
    with root_folder() as secrets:
        cert, key = certificate(secrets, "a")
        path = pem(secrets, "gateway", cert, key)
        env.vars["EPYCD_GATEWAY_TLS_CERT_FILE"] = str(path)
        approved_gateway(env)
        # the same files again: a reload, no restart
        env.systemctl_log.write_text("")
        assert env.epycctl("gateway", "approve", "--yes").returncode == 0
        assert env.systemctl_calls()[-1] == f"reload {UNIT}"
        # certbot's way: a new certificate and key at the same path
        renewed_cert, renewed_key = certificate(secrets, "renewed")
        pem(secrets, "gateway", renewed_cert, renewed_key)
        env.systemctl_log.write_text("")
        done = env.epycctl("gateway", "approve", "--yes")
        assert done.returncode == 0, done.stderr
        assert env.systemctl_calls()[-1] == f"restart {UNIT}"
        # the unit loads epycd's checked copy, root's alone, now the renewed one
        copy = gateway_folder(env) / "tls.pem"
        unit = (env.settings.unit_dir / UNIT).read_text()
        assert f"LoadCredential=tls.pem:{copy}\n" in unit
        assert oct(copy.stat().st_mode & 0o777) == "0o600"
        assert renewed_cert.read_text().strip() in copy.read_text()
        # renewed again, then a key's change: that update restarts it too
        third_cert, third_key = certificate(secrets, "third")
        pem(secrets, "gateway", third_cert, third_key)
        env.systemctl_log.write_text("")
        done = env.epycctl("gateway", "add-key", "alice")
        assert done.returncode == 0, done.stderr
        assert env.systemctl_calls()[-1] == f"restart {UNIT}"
        assert third_cert.read_text().strip() in copy.read_text()


def test_a_renewal_haproxy_cannot_load_refuses_a_key_change_and_keeps_the_gateway(
    env: ApprovalSandbox,
) -> None:
    """A renewal gone wrong (the new certificate with the old key) at the same path: the
    next key change is refused before the store is written, and nothing restarts."""
    with root_folder() as secrets:
        cert, key = certificate(secrets, "a")
        path = pem(secrets, "gateway", cert, key)
        env.vars["EPYCD_GATEWAY_TLS_CERT_FILE"] = str(path)
        approved_gateway(env)
        copy = gateway_folder(env) / "tls.pem"
        before = copy.read_text() if copy.exists() else None
        renewed, _ = certificate(secrets, "renewed")
        pem(secrets, "gateway", renewed, key)
        env.systemctl_log.write_text("")
        done = env.epycctl("gateway", "add-key", "alice")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "inconsistencies between private key and certificate" in done.stderr
    assert "sk-epyc-" not in done.stdout
    assert not (gateway_folder(env) / "keys.json").exists()
    assert before is not None and copy.read_text() == before
    assert env.systemctl_calls() == []


# 12. The key store's names are anchored, and checked before anything is written


@pytest.mark.parametrize(
    "client",
    [
        {"name": "alice evil"},
        {"name": "alice\nbob"},
        {"name": "alice", "models": ["chat-model extra"]},
        {"name": "alice", "models": ["#comment"]},
        {"name": "alice", "sha256": "0" * 64 + " x"},
    ],
)
def test_a_stored_name_that_only_starts_right_is_refused_before_anything_is_written(
    env: ApprovalSandbox, client: dict[str, object]
) -> None:
    approved_gateway(env)
    stored = {"name": "alice", "sha256": "0" * 64, "added_at": "2026-01-01T00:00:00Z"} | client
    store = gateway_folder(env) / "keys.json"
    write_secret(store, json.dumps({"keys": [stored]}))
    before = store.read_text()
    written = {p: p.read_bytes() for p in gateway_folder(env).rglob("*") if p.is_file()}
    done = env.epycctl("gateway", "add-key", "bob")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{store}: keys.0." in done.stderr and "Traceback" not in done.stderr
    assert store.read_text() == before
    assert {p: p.read_bytes() for p in gateway_folder(env).rglob("*") if p.is_file()} == written
    with pytest.raises(ValidationError):
        ClientKey.model_validate(stored)


def test_a_damaged_store_never_breaks_an_endpoints_approval_after_its_record_is_written(
    env: ApprovalSandbox,
) -> None:
    """The endpoint's approval stands and the gateway says it was not updated, with the
    store's file and entry: no assertion, no traceback after the record was written."""
    approved_gateway(env)
    store = gateway_folder(env) / "keys.json"
    stored = {"name": "alice evil", "sha256": "0" * 64, "added_at": "2026-01-01T00:00:00Z"}
    write_secret(store, json.dumps({"keys": [stored]}))
    done = env.epycctl("approve", "chat", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "AssertionError" not in done.stderr
    assert f"gateway: not updated: {store}: keys.0.name" in done.stdout + done.stderr


# 13. The key store is root's alone


def test_a_key_store_others_may_read_or_own_is_refused_with_the_fix(env: ApprovalSandbox) -> None:
    assert env.epycctl("gateway", "add-key", "alice").returncode == 0
    store = env.settings.state_dir / "gateway" / "keys.json"
    before = store.read_text()
    store.chmod(0o644)
    done = env.epycctl("gateway", "keys")
    assert done.returncode == 2, done.stdout
    assert f"{store} is readable or writable by others" in done.stderr
    assert f"chmod 600 {store}" in done.stderr
    store.chmod(0o600)
    os.chown(store, NOBODY, NOBODY)
    done = env.epycctl("gateway", "add-key", "bob")
    assert done.returncode == 2 and "not root" in done.stderr, done.stderr
    assert store.read_text() == before
    os.chown(store, 0, 0)
    assert env.epycctl("gateway", "keys").returncode == 0


# 16. Every value in haproxy.cfg or a map by an anchored rule; no IPv6 zone


def test_a_gateway_address_with_an_ipv6_zone_is_refused_at_its_key(env: ApprovalSandbox) -> None:
    for key in ("EPYCD_GATEWAY_LISTEN", "EPYCD_GATEWAY_METRICS_LISTEN"):
        env.vars[key] = "[fe80::1%lo]:18090"
        done = env.epycctl("gateway", "approve", "--yes")
        assert done.returncode == 2, done.stdout
        assert key.removeprefix("EPYCD_").lower() in done.stderr
        assert "IPv6 zone (%lo), which HAProxy cannot bind" in done.stderr
        assert "[::]:18090" in done.stderr
        env.vars[key] = LISTEN if key == "EPYCD_GATEWAY_LISTEN" else "127.0.0.1:9465"
    assert not (env.settings.unit_dir / UNIT).exists()
    assert not gateway_folder(env).exists()


@pytest.mark.parametrize("key", ["EPYCD_GATEWAY_LISTEN", "EPYCD_GATEWAY_METRICS_LISTEN"])
def test_a_gateway_port_an_approved_stopped_endpoint_holds_is_refused_naming_it(
    env: ApprovalSandbox, key: str
) -> None:
    """The address book's gateway side: the port of an approved endpoint whose units are
    not running (nothing listens there) is still its own."""
    plan: Plan = make_plan("chat", env.host(), env.settings.config_dir, socket=0, port=18111)
    env.set_plans(plan)
    done = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stderr
    env.vars[key] = "127.0.0.1:18111"
    done = env.epycctl("gateway", "approve", "--yes")
    assert done.returncode == 2, done.stdout
    assert key.removeprefix("EPYCD_").lower() in done.stderr
    assert "approved endpoint chat" in done.stderr and "epycctl remove chat" in done.stderr
    assert not (env.settings.unit_dir / UNIT).exists()
    assert not gateway_folder(env).exists()


@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1:80 ssl crt /etc/x",
        "127.0.0.1:80\nbackend evil",
        "[fe80::1%eth0]:80",
        "localhost:80",
        "127.0.0.1:80#",
        "[::1]:99999",
    ],
)
def test_an_address_passes_only_by_the_anchored_rule(value: str) -> None:
    with pytest.raises(InputError, match=r"not written into the gateway's haproxy\.cfg"):
        checked(ADDRESS, value)


def test_no_value_reaches_the_files_but_by_its_rule(tmp_path: Path) -> None:
    route = Route(endpoint="chat", model="chat-model", primary_endpoint="chat_completions",
                  address="127.0.0.1:8000")  # fmt: skip
    args: dict[str, object] = {
        "listen": "127.0.0.1:8080", "metrics_listen": "", "folder": tmp_path,
        "endpoint_keys": {}, "endpoint_keys_path": "${CREDENTIALS_DIRECTORY}/endpoint-keys.map",
    }  # fmt: skip
    gateway_files([route], KeyStore(), **args)  # type: ignore[arg-type]
    hostile: list[tuple[dict[str, object], list[Route]]] = [
        ({"listen": "127.0.0.1:8080 ssl"}, [route]),
        ({"folder": tmp_path / "a b"}, [route]),
        ({}, [route.model_copy(update={"address": "127.0.0.1:8000 backup"})]),
        ({"endpoint_keys": {"chat": "two words"}}, [route]),
    ]
    for changed, routes in hostile:
        with pytest.raises(InputError):
            gateway_files(routes, KeyStore(), **(args | changed))  # type: ignore[arg-type]
    client = ClientKey.model_construct(
        name="alice evil", sha256="0" * 64, models=None, added_at=datetime.now(UTC)
    )
    with pytest.raises(InputError, match="client name"):
        gateway_files([route], KeyStore(keys=[client]), **args)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        checked(PATH, "/state/gateway/haproxy/x.map ${HOME}")
