"""`epycctl gateway plan`, `add-key`, `keys` and `revoke` in a subprocess, on endpoints
approved through the real `epycctl approve` (tests/approval's sandbox)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epycd.plan.endpoint import Plan
from epycd.spec import parse_endpoint
from epycd.stack import shipped_stack
from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.plans import make_plan
from tests.gateway.sandbox import gateway_env

NOBODY = 65534


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    with gateway_env(tmp_path, monkeypatch) as sandbox:
        yield sandbox


def serving(plan: Plan, model: str) -> Plan:
    decisions = plan.decisions.model_copy(update={"served_model_name": model})
    return plan.model_copy(update={"decisions": decisions})


def approve_all(env: ApprovalSandbox, models: dict[str, str]) -> None:
    host = env.host()
    plans = [
        serving(make_plan(name, host, env.settings.config_dir, socket=i, port=8000 + i), model)
        for i, (name, model) in enumerate(models.items())
    ]
    env.set_plans(*plans)
    for name in models:
        done = env.epycctl("approve", name, "--yes", "--no-start")
        assert done.returncode == 0, done.stderr


def gateway_plan(env: ApprovalSandbox) -> Any:
    done = env.epycctl("gateway", "plan", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_plan_routes_each_approved_endpoints_model(env: ApprovalSandbox) -> None:
    approve_all(env, {"chat": "tiny-chat", "emb": "tiny-embedder"})
    planned = gateway_plan(env)
    routes = planned["routes"]
    assert isinstance(routes, list)
    assert [(r["model"], r["endpoint"], r["address"]) for r in routes] == [
        ("tiny-chat", "chat", "127.0.0.1:8000"),
        ("tiny-embedder", "emb", "127.0.0.1:8001"),
    ]
    assert planned["skipped"] == [] and planned["listen"] == ""
    text = env.epycctl("gateway", "plan").stdout
    assert "set gateway_listen in" in text and "tiny-embedder  emb" in text


def test_a_model_name_served_twice_or_a_damaged_record_leaves_only_that_endpoint_out(
    env: ApprovalSandbox,
) -> None:
    approve_all(env, {"a": "same", "b": "same"})
    planned = gateway_plan(env)
    assert [r["endpoint"] for r in planned["routes"]] == ["a"]
    assert planned["skipped"] == [
        {"endpoint": "b", "reason": "endpoint a serves the model name 'same' already"}
    ]
    (env.settings.state_dir / "approvals" / "a.json").write_text("{damaged")
    planned = gateway_plan(env)
    assert [r["endpoint"] for r in planned["routes"]] == ["b"]
    assert planned["skipped"][0]["endpoint"] == "a"


def test_aliases_are_routed_after_every_model_name_and_a_taken_one_is_left_out_alone(
    env: ApprovalSandbox,
) -> None:
    host = env.host()
    plans = []
    for i, (name, model, aliases) in enumerate([
        ("a", "a-model", ["b-model", "gpt-4o-mini", "shared"]),
        ("b", "b-model", ["shared", "text-embedding-3-small"]),
    ]):  # fmt: skip
        plan = make_plan(name, host, env.settings.config_dir, socket=i, port=8000 + i)
        decisions = plan.decisions.model_copy(
            update={"served_model_name": model, "model_aliases": aliases}
        )
        plans.append(plan.model_copy(update={"decisions": decisions}))
    env.set_plans(*plans)
    for plan in plans:
        assert env.epycctl("approve", plan.endpoint, "--yes", "--no-start").returncode == 0
    planned = gateway_plan(env)
    # a's alias may not take b's model name; the first by endpoint name keeps "shared"
    assert [(r["endpoint"], r["model"], r["aliases"]) for r in planned["routes"]] == [
        ("a", "a-model", ["gpt-4o-mini", "shared"]),
        ("b", "b-model", ["text-embedding-3-small"]),
    ]
    assert planned["skipped"] == [
        {"endpoint": "a", "reason": "its alias 'b-model' is endpoint b's name already"},
        {"endpoint": "b", "reason": "its alias 'shared' is endpoint a's name already"},
    ]


def test_add_key_prints_the_key_once_and_keeps_only_its_digest(env: ApprovalSandbox) -> None:
    done = env.epycctl("gateway", "add-key", "alice", "--models", "tiny-chat, tiny-embedder",
                       "--rpm", "30", "--concurrency", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    key = done.stdout.splitlines()[-1]
    assert key.startswith("sk-epyc-") and len(key) > 40
    store_path = env.settings.state_dir / "gateway" / "keys.json"
    store = store_path.read_text()
    assert key not in store
    assert stat.S_IMODE(store_path.stat().st_mode) == 0o600
    [client] = json.loads(store)["keys"]
    assert client["sha256"] == hashlib.sha256(key.encode()).hexdigest()
    assert (client["models"], client["rpm"], client["concurrency"]) == (
        ["tiny-chat", "tiny-embedder"], 30, 2)  # fmt: skip
    listed = json.loads(env.epycctl("gateway", "keys", "--json").stdout)["keys"]
    assert [k["name"] for k in listed] == ["alice"] and "sha256" not in listed[0]
    assert key not in env.epycctl("gateway", "keys").stdout
    # a second key of the same name is refused and changes nothing
    again = env.epycctl("gateway", "add-key", "alice")
    assert again.returncode == 2 and "revoke it first" in again.stderr
    assert store_path.read_text() == store
    assert env.epycctl("gateway", "revoke", "alice").returncode == 0
    assert json.loads(store_path.read_text())["keys"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["Alice"], "is not a client name"),
        (["bob", "--models", "a b"], "is not a model name"),
        (["bob", "--models", ","], "--models: names no model"),
        (["bob", "--rpm", "0"], "0 is not in the range 1<=x<=999999999"),
    ],
)
def test_bad_key_requests_are_refused_and_change_nothing(
    env: ApprovalSandbox, args: list[str], says: str
) -> None:
    done = env.epycctl("gateway", "add-key", *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (env.settings.state_dir / "gateway" / "keys.json").exists()


def test_revoking_an_unknown_key_names_the_known_ones(env: ApprovalSandbox) -> None:
    assert env.epycctl("gateway", "add-key", "alice").returncode == 0
    done = env.epycctl("gateway", "revoke", "bob")
    assert done.returncode == 2 and "no key named 'bob' (the keys: alice)" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_only_an_admin_adds_or_revokes_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    base = Path(tempfile.mkdtemp(prefix="epycd-gw-"))
    base.chmod(0o755)  # pytest's own tmp folder is root-only
    try:
        env = make_env(base, monkeypatch)
        for args in (["add-key", "alice"], ["revoke", "alice"]):
            done = env.epycctl("gateway", *args, user=NOBODY)
            assert done.returncode == 1, done.stderr
            assert "gateway keys needs root; you are nobody" in done.stderr
        assert not (env.settings.state_dir / "gateway" / "keys.json").exists()
    finally:
        shutil.rmtree(base)


def test_an_endpoint_file_named_gateway_is_refused_as_reserved() -> None:
    """Its unit would be the gateway's own (epyc-llm-gateway.service)."""
    spec = parse_endpoint(
        Path("/etc/epyc-llm/gateway.toml"), b'model = "Qwen/Qwen3-0.6B"\n',
        precisions=shipped_stack().precisions,
    )  # fmt: skip
    assert not spec.ok
    [error] = spec.errors
    assert (error.key, error.fix) == ("file name", "rename the file")
    assert "'gateway' is reserved: the gateway's unit is epyc-llm-gateway.service" in error.message
