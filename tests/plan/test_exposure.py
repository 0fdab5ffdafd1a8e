"""Where an endpoint listens and whether it needs an API key.

Like Ollama: loopback unless the endpoint file says `host = ...`; an `api_key_file` (root-only,
like hf_token_file) reaches vLLM without landing in the plan or a unit; listening beyond
loopback without a key needs consent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.host.facts import HostFacts
from tests.plan.conftest import PlanWorkspace, cpu, fake_host
from tests.sandbox import run_python
from tests.secrets import root_folder, write_secret

KEY = "test-key-0123456789"


@pytest.fixture
def host(tmp_path: Path) -> HostFacts:
    return fake_host(tmp_path, "genoa-9654-2s-nps1")


@pytest.fixture
def ws() -> Iterator[PlanWorkspace]:
    """A workspace in a folder only root controls, where a key file is accepted."""
    with root_folder() as folder:
        yield PlanWorkspace(folder)


def key_file(ws: PlanWorkspace, text: str = KEY + "\n", mode: int = 0o600) -> Path:
    return write_secret(ws.tmp / "secrets" / "api.key", text, mode)


def test_an_endpoint_listens_on_loopback_by_default(ws: PlanWorkspace, host: HostFacts) -> None:
    ws.endpoint("chat")
    whole_plan = ws.plan(host)["chat"].plan
    assert whole_plan is not None
    plan = cpu(whole_plan)
    assert plan.host == "127.0.0.1"
    at = plan.vllm_args.index("--host")
    assert plan.vllm_args[at + 1] == "127.0.0.1"
    assert not plan.requires_confirmation
    assert "--host 127.0.0.1" in next(iter(whole_plan.units.values()))


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.10"])
def test_listening_beyond_loopback_without_a_key_needs_consent(
    ws: PlanWorkspace, host: HostFacts, address: str
) -> None:
    ws.endpoint("chat", f'host = "{address}"\n')
    plan = cpu(ws.plan(host)["chat"].plan)
    assert plan.host == address
    assert plan.requires_confirmation
    [reason] = [r for r in plan.confirmation_reasons if "API key" in r]
    assert address in reason and "api_key_file" in reason


def test_listening_beyond_loopback_with_a_key_needs_no_consent(
    ws: PlanWorkspace, host: HostFacts
) -> None:
    path = key_file(ws)
    ws.endpoint("chat", f'host = "0.0.0.0"\napi_key_file = "{path}"\n')
    whole_plan = ws.plan(host)["chat"].plan
    assert whole_plan is not None
    plan = cpu(whole_plan)
    assert not plan.requires_confirmation, plan.confirmation_reasons
    assert plan.api_key_file == str(path)
    assert KEY not in whole_plan.model_dump_json()
    unit = next(iter(whole_plan.units.values()))
    assert KEY not in unit and f"{path}:/run/secrets/api_key:ro" in unit


@pytest.mark.parametrize("address", ["localhost", "0.0.0.0:8000", "fe80::1%eth0", "", "1.2.3"])
def test_a_host_that_is_not_an_address_names_file_and_key(
    ws: PlanWorkspace, host: HostFacts, address: str
) -> None:
    path = ws.endpoint("chat", f'host = "{address}"\n')
    [problem] = ws.plan(host)["chat"].errors
    assert problem.exit_code == 2
    assert problem.file == str(path) and problem.key == "host"
    assert "0.0.0.0" in problem.text


@pytest.mark.parametrize(
    ("text", "mode", "said"),
    [
        (KEY, 0o644, "chmod 600"),
        (f"VLLM_API_KEY={KEY}", 0o600, "only the key"),
        ("", 0o600, "one key"),
        (f"{KEY}\n{KEY}", 0o600, "one key"),
        ("key with spaces", 0o600, "one key"),
    ],
)
def test_a_bad_key_file_is_refused_without_showing_the_key(
    ws: PlanWorkspace, host: HostFacts, text: str, mode: int, said: str
) -> None:
    path = key_file(ws, text, mode)
    config = ws.endpoint("chat", f'api_key_file = "{path}"\n')
    [problem] = ws.plan(host)["chat"].errors
    assert problem.exit_code == 2
    assert problem.file == str(config) and problem.key == "api_key_file"
    assert said in problem.text
    assert KEY not in problem.text and "key with spaces" not in problem.text


def test_a_missing_key_file_is_refused(ws: PlanWorkspace, host: HostFacts) -> None:
    ws.endpoint("chat", f'api_key_file = "{ws.tmp}/absent.key"\n')
    [problem] = ws.plan(host)["chat"].errors
    assert problem.key == "api_key_file" and "mode 0600" in problem.text


NOBODY = 65534
PLAN_AS_NOBODY = """
import sys
from pathlib import Path
from tests.plan.conftest import PlanWorkspace, cpu, fake_host
ws = PlanWorkspace.__new__(PlanWorkspace)
root = Path(sys.argv[1])
ws.tmp, ws.config_dir, ws.hf_home = root, root / "etc-epyc-llm", root / "hf"
from epycd.settings import Settings
ws.settings = Settings(config_dir=ws.config_dir, state_dir=root / "state", run_dir=root / "run",
                       unit_dir=root / "u", quadlet_dir=root / "q", host_root=root)
host = fake_host(root / sys.argv[2], "genoa-9654-2s-nps1")
result = ws.plan(host)["chat"]
print(result.plan.fingerprint if result.plan else [p.text for p in result.errors])
"""


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder another user can read (pytest's tmp_path is root-only) and only root
    controls (where a key file is accepted)."""
    with root_folder() as folder:
        yield folder


def test_a_user_who_cannot_read_the_key_file_gets_the_same_plan(shared_folder: Path) -> None:
    """Only root reads api_key_file; the plan does not depend on the key, so `status` and
    `plan` as another user see the same plan instead of an error (or a drift)."""
    root = shared_folder
    ws = PlanWorkspace(root)
    path = key_file(ws)
    ws.endpoint("chat", f'host = "0.0.0.0"\napi_key_file = "{path}"\n')
    (root / "nobody").mkdir(mode=0o777)
    (root / "nobody").chmod(0o777)
    for folder in (root, *root.rglob("*")):
        if folder != path:
            folder.chmod(folder.stat().st_mode | 0o005 | (0o050 if folder.is_dir() else 0))
    as_root = run_python(["-c", PLAN_AS_NOBODY, str(root), "root"], env=os.environ)
    nobody = run_python(["-c", PLAN_AS_NOBODY, str(root), "nobody"], env=os.environ, user=NOBODY)
    assert as_root.returncode == 0 and nobody.returncode == 0, as_root.stderr + nobody.stderr
    assert len(as_root.stdout.strip()) == 64, as_root.stdout
    assert nobody.stdout == as_root.stdout
