"""Approval records of every era the product has written (tests/approval/records/, made by
each era's own code: tests/dev/record_fixtures.py) still work with today's code:

- each loads (`load_approval`, the bytes as they are on an admin's disk);
- the boot check (`check_problems`, every unit's ExecCondition=) passes on the host it was
  approved on with its units installed: an upgrade must not stop an approved endpoint;
- today's `render_units` of its plan is what it was when these tests were written
  (expected-render/, `UPDATE_RECORD_RENDER=1` rewrites it: review the diff), or the error
  it refuses it with, as a file `ERROR` (E1-E3: their OpenMP bind list takes every pinned
  CPU). The product never re-renders a record (the boot check hashes the installed units),
  so this is a lock on what a re-render would make, not a requirement that it works;
- a record of the newest era re-renders to its stored units byte for byte, each matching
  the sha256 the record holds for it (but the approval tests' hand-made plans, whose units
  are stand-ins);
- an install interrupted after the oldest record was staged is finished by `recover` and
  its record loads.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from epycd.approval.check import check_problems
from epycd.approval.install import FileChange, Transaction, journal_path, recover
from epycd.approval.record import (
    Approval,
    approval_from_json,
    approval_path,
    load_approval,
    sha256_text,
)
from epycd.atomic import staged_path
from epycd.errors import EpycError
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from epycd.render import render_units
from epycd.settings import Settings
from tests.hosts import make_host, write_python, write_venv_vllm

RECORDS = Path(__file__).resolve().parent / "records"
HAND_MADE = "tests/approval/plans.py make_plan"
"""The approval tests' hand-made plans, whose units are short stand-ins, not rendered."""
EXPECTED = RECORDS / "expected-render"
UPDATE = os.environ.get("UPDATE_RECORD_RENDER") == "1"
HOST_VLLM_VENVS = ("/opt/vllm-env", "/opt/vllm")
"""Where the records' host vLLMs live (tests/render/fixtures.py, tests/approval/plans.py and
the golden cases): the boot check reads their interpreter's Python.h."""


@dataclass(frozen=True)
class Fixture:
    era: str
    folder: str
    file: str
    about: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.folder}/{Path(self.file).stem}"

    @property
    def path(self) -> Path:
        return RECORDS / self.folder / self.file

    @property
    def endpoint(self) -> str:
        return self.about["endpoint"]

    @property
    def host(self) -> str:
        return self.about["host"]

    @property
    def root(self) -> str:
        """The folder the record's files lived in when its era made it."""
        return self.about["root"]

    @cached_property
    def raw(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_bytes())
        return data


def era_number(era: str) -> int:
    return int(era.removeprefix("E"))


def manifests() -> list[dict[str, Any]]:
    found = [json.loads(path.read_text()) for path in RECORDS.glob("E*-*/manifest.json")]
    return sorted(found, key=lambda m: era_number(m["era"]))


def all_fixtures() -> list[Fixture]:
    return [
        Fixture(m["era"], f"{m['era']}-{m['commit'][:7]}", file, about)
        for m in manifests()
        for file, about in sorted(m["records"].items())
    ]


FIXTURES = all_fixtures()
ERAS = [m["era"] for m in manifests()]
NEWEST_RENDERED = [f for f in FIXTURES if f.era == ERAS[-1] and f.about["source"] != HAND_MADE]
"""The newest era's records whose units its renderer made (not the hand-made plans')."""
OLDEST = [f for f in FIXTURES if f.era == ERAS[0]]


def by_id(fixtures: list[Fixture]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("fixture", fixtures, ids=[f.id for f in fixtures])


def settings_for(tmp: Path, fixture: Fixture, host_root: Path | None = None) -> Settings:
    """Settings with the record's unit folders (`unit_root`) and state in `tmp`."""
    return Settings(
        config_dir=tmp / "etc-epyc-llm",
        state_dir=tmp / "state",
        run_dir=tmp / "run",
        unit_dir=Path(fixture.root) / "systemd",
        quadlet_dir=Path(fixture.root) / "containers-systemd",
        host_root=host_root or tmp,
    )


def store(settings: Settings, fixture: Fixture, data: bytes) -> Path:
    path = approval_path(settings, fixture.endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def loaded(settings: Settings, fixture: Fixture) -> Approval:
    approval = load_approval(settings, fixture.endpoint)
    assert approval is not None
    return approval


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, HostFacts]]:
    """Catalogue host -> (its root, its detection), each root with the records' host vLLM
    venvs made from a python3.11 with its headers, and a C++ compiler (tests/hosts.py)."""
    base = tmp_path_factory.mktemp("record-hosts")
    made = {}
    for name in sorted({f.host for f in FIXTURES}):
        root = make_host(base, name)
        write_python(root, "/usr", "3.11", headers=True)
        for venv in HOST_VLLM_VENVS:
            write_venv_vllm(root, venv, "/usr/bin/python3.11")
        made[name] = (root, detect_host(root, probe_runtimes=False))
    return made


def test_every_era_is_there() -> None:
    """E1 to E13 at least, none missing, each folder holding exactly the records its
    manifest names."""
    assert len(ERAS) >= 13
    assert [f"E{n}" for n in range(1, len(ERAS) + 1)] == ERAS
    for m in manifests():
        folder = RECORDS / f"{m['era']}-{m['commit'][:7]}"
        on_disk = {p.name for p in folder.glob("*.json")} - {"manifest.json"}
        assert on_disk == set(m["records"]), folder


@by_id(FIXTURES)
def test_the_record_loads(fixture: Fixture, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, fixture)
    store(settings, fixture, fixture.path.read_bytes())
    approval = loaded(settings, fixture)
    assert approval.endpoint == approval.plan.endpoint == fixture.endpoint
    assert set(approval.units) == set(approval.plan.units)


def installed(
    tmp: Path, fixture: Fixture, host_root: Path, raw: dict[str, Any] | None = None
) -> Settings:
    """The record (as `raw`, by default the fixture) with its unit files installed in
    `tmp`: their install paths (`units[*].path`) moved from the era's folder to `tmp`, their
    texts as the record holds them."""
    record = json.loads(json.dumps(raw or fixture.raw))
    for name, unit in record["units"].items():
        assert unit["path"].startswith(fixture.root + "/"), unit["path"]
        unit["path"] = str(tmp) + unit["path"].removeprefix(fixture.root)
        target = Path(unit["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(record["plan"]["units"][name])
    settings = Settings(
        config_dir=tmp / "etc-epyc-llm",
        state_dir=tmp / "state",
        run_dir=tmp / "run",
        unit_dir=tmp / "systemd",
        quadlet_dir=tmp / "containers-systemd",
        host_root=host_root,
    )
    store(settings, fixture, json.dumps(record, indent=2).encode())
    return settings


@by_id(FIXTURES)
def test_the_boot_check_passes_on_its_host(
    fixture: Fixture, tmp_path: Path, hosts: dict[str, tuple[Path, HostFacts]]
) -> None:
    root, host = hosts[fixture.host]
    settings = installed(tmp_path, fixture, root)
    assert check_problems(settings, fixture.endpoint, host) == []


def rendered(fixture: Fixture, tmp_path: Path) -> dict[str, str]:
    """Today's units of the record's plan, or its error as the one file `ERROR`."""
    settings = settings_for(tmp_path, fixture)
    store(settings, fixture, fixture.path.read_bytes())
    try:
        return render_units(loaded(settings, fixture).plan.decisions)
    except EpycError as exc:
        return {"ERROR": f"{type(exc).__name__}: {exc}\n"}


@by_id(FIXTURES)
def test_todays_render_of_the_plan_is_unchanged(fixture: Fixture, tmp_path: Path) -> None:
    units = rendered(fixture, tmp_path)
    expected = EXPECTED / fixture.id
    if UPDATE:
        shutil.rmtree(expected, ignore_errors=True)
        for name, text in units.items():
            (expected / name).parent.mkdir(parents=True, exist_ok=True)
            (expected / name).write_text(text, encoding="utf-8")
    assert expected.is_dir(), f"{expected} is missing: run with UPDATE_RECORD_RENDER=1"
    on_disk = {
        p.relative_to(expected).as_posix(): p.read_text(encoding="utf-8")
        for p in expected.rglob("*")
        if p.is_file()
    }
    assert sorted(units) == sorted(on_disk)
    for name, text in units.items():
        assert text == on_disk[name], name


def test_every_render_snapshot_has_its_record() -> None:
    """A snapshot whose record is gone would never be compared again."""
    snapshots = {f"{era.name}/{p.name}" for era in EXPECTED.iterdir() for p in era.iterdir()}
    assert snapshots == {f.id for f in FIXTURES}


@by_id(NEWEST_RENDERED)
def test_the_newest_records_re_render_byte_for_byte(fixture: Fixture, tmp_path: Path) -> None:
    """Today's records are today's renderer's output: the units a re-render makes are the
    stored ones, and each stored unit is the text whose sha256 the record holds."""
    approval = approval_from_json(fixture.path.read_text())
    assert render_units(approval.plan.decisions) == approval.plan.units
    assert set(approval.units) == set(approval.plan.units)
    for name, text in approval.plan.units.items():
        assert sha256_text(text) == approval.units[name].sha256, name


@by_id(OLDEST)
def test_an_install_interrupted_with_the_oldest_record_staged_recovers(
    fixture: Fixture, tmp_path: Path, hosts: dict[str, tuple[Path, HostFacts]]
) -> None:
    """The journal of an install killed after its commit point, from before an upgrade:
    the oldest record and its units are staged; the upgraded product rolls it forward (the
    bytes as staged, install.py `recover`), and the record loads and passes the boot check."""
    root, host = hosts[fixture.host]
    settings = installed(tmp_path, fixture, root)
    record = approval_path(settings, fixture.endpoint)
    changes = []
    for unit in json.loads(record.read_text())["units"].values():
        target = Path(unit["path"])
        staged = staged_path(target, "new")
        target.rename(staged)
        changes.append(FileChange(target=str(target), staged=str(staged), sha256=unit["sha256"]))
    staged = staged_path(record, "new")
    record.rename(staged)
    changes.append(
        FileChange(target=str(record), staged=str(staged), sha256=sha256_text(staged.read_text()))
    )
    journal = journal_path(settings, fixture.endpoint)
    journal.parent.mkdir(parents=True)
    transaction = Transaction(endpoint=fixture.endpoint, action="install", files=changes)
    journal.write_text(transaction.model_dump_json(indent=2))
    assert load_approval(settings, fixture.endpoint) is None

    assert recover(settings) == [f"repaired: {fixture.endpoint}: finished an interrupted install"]
    assert not journal.exists()
    assert loaded(settings, fixture).plan.units == fixture.raw["plan"]["units"]
    assert check_problems(settings, fixture.endpoint, host) == []
