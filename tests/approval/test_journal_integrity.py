"""Recovery only ever touches the endpoint's files in the product's own unit, Quadlet and
state folders: a journal (or an approval record) that names anything else is refused,
nothing of it carried out, and the other endpoints are not disturbed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from epycd.approval.record import approval_path, load_approval
from tests.approval.conftest import ApprovalSandbox
from tests.approval.isolation import (
    approve_two,
    assert_clean,
    boot_check,
    daemon_status,
    status_rows,
)

STAGED = ".victim.new.epycd-staged"
Journal = Callable[[ApprovalSandbox, Path], list[dict[str, Any]]]


def outside_folder(env: ApprovalSandbox) -> Path:
    folder = env.tmp / "outside"
    folder.mkdir(exist_ok=True)
    (folder / "victim").write_text("precious\n")
    (folder / STAGED).write_text("planted\n")
    return folder


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(env: ApprovalSandbox, name: str = "beta") -> dict[str, Any]:
    return {"target": str(approval_path(env.settings, name))}


def deletes_outside(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    return [{"target": str(out / "victim")}, record(env)]


def dot_dot(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    return [{"target": f"{env.settings.unit_dir}/../outside/victim"}, record(env)]


def replaces_outside(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    staged = out / STAGED
    return [
        {"target": str(out / "victim"), "staged": str(staged), "sha256": sha(staged)},
        record(env),
    ]


def stages_from_outside(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    staged = out / STAGED
    unit = env.settings.unit_dir / "epyc-llm-beta.service"
    return [{"target": str(unit), "staged": str(staged), "sha256": sha(staged)}, record(env)]


def through_a_symlinked_dropin(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    link = env.settings.unit_dir / "epyc-llm-beta.service.d"
    link.symlink_to(out)
    return [{"target": str(link / "victim")}, record(env)]


def another_endpoints_record(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    return [{"target": str(env.settings.unit_dir / "epyc-llm-alpha.service")}, record(env, "alpha")]


def another_endpoints_unit(env: ApprovalSandbox, out: Path) -> list[dict[str, Any]]:
    return [{"target": str(env.settings.unit_dir / "epyc-llm-alpha.service")}, record(env)]


JOURNALS: dict[str, Journal] = {
    "deletes-outside": deletes_outside,
    "dot-dot": dot_dot,
    "replaces-outside": replaces_outside,
    "stages-from-outside": stages_from_outside,
    "symlinked-dropin": through_a_symlinked_dropin,
    "another-endpoints-record": another_endpoints_record,
    "another-endpoints-unit": another_endpoints_unit,
}


@pytest.mark.parametrize("kind", JOURNALS)
def test_a_journal_naming_other_paths_is_refused(env: ApprovalSandbox, kind: str) -> None:
    approve_two(env)
    before = status_rows(env)
    out = outside_folder(env)
    alpha_unit = env.settings.unit_dir / "epyc-llm-alpha.service"
    alpha_text = alpha_unit.read_text()
    journal = env.settings.state_dir / "transactions" / "beta.json"
    journal.parent.mkdir(exist_ok=True)
    files = JOURNALS[kind](env, out)
    journal.write_text(json.dumps({"endpoint": "beta", "action": "install", "files": files}))

    done = env.epycctl("approve", "alpha", "--yes", "--no-start")
    assert_clean(done, 0)
    assert f"refused: {journal}: " in done.stdout
    assert "nothing of it was carried out" in done.stdout
    by_daemon = daemon_status(env)

    assert (out / "victim").read_text() == "precious\n"
    assert (out / STAGED).read_text() == "planted\n"
    assert alpha_unit.read_text() == alpha_text
    assert load_approval(env.settings, "alpha") is not None
    assert load_approval(env.settings, "beta") is not None
    assert journal.exists()
    assert by_daemon["alpha"]["state"] == before["alpha"]["state"]
    assert status_rows(env)["alpha"] == before["alpha"]
    assert boot_check(env, "alpha").returncode == 0
    assert "an install was interrupted" in boot_check(env, "beta").stderr

    again = env.epycctl("approve", "beta", "--yes", "--no-start")
    assert_clean(again, 0)
    assert not journal.exists()
    assert (out / "victim").read_text() == "precious\n"


def test_a_record_naming_a_unit_elsewhere_is_damaged_and_remove_leaves_that_file(
    env: ApprovalSandbox,
) -> None:
    approve_two(env)
    out = outside_folder(env)
    path = approval_path(env.settings, "beta")
    data = json.loads(path.read_text())
    data["units"]["epyc-llm-beta.service"]["path"] = str(out / "victim")
    path.write_text(json.dumps(data))

    assert status_rows(env)["beta"]["state"] == "damaged"
    removed = env.epycctl("remove", "beta", "--yes", "--no-stop")
    assert_clean(removed, 0)
    assert (out / "victim").read_text() == "precious\n"
    assert not path.exists()
    assert not (env.settings.unit_dir / "epyc-llm-beta.service").exists()
