"""The record migration (epycd/approval/migrate.py) against the stored records of every era
(tests/approval/records/): each format-1 step is exactly what the records before its commit
lack, the migrated records are complete (no model default fills a gap), a newer format is
refused as such, garbage is a damaged record, and nothing is rewritten on load."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from epycd.approval import migrate as m
from epycd.approval.record import Approval, approval_path, load_approval
from epycd.approval.shape import HostShape
from epycd.engines.vllm.plan.argv import vllm_argv
from epycd.engines.vllm.plan.invocation import VllmInvocation
from epycd.engines.vllm.plan.model import VllmCpuServer, VllmInstinctServer
from epycd.errors import InputError
from epycd.model.facts import MemoryFit
from epycd.plan.endpoint import Plan, shared_fields
from epycd.plan.problem import Problem
from epycd.readfile import RECORD_MAX_BYTES
from epycd.settings import Settings
from tests.approval.test_records import ERAS, FIXTURES, Fixture, era_number
from tests.sandbox import REPO

FIRST_ERA_WITH: dict[m.Step, str] = {
    m.drop_exec_start_pre: "E2",
    m.listen_host_all: "E3",
    m.tuning_keys: "E4",
    m.memory_keys: "E9",
    m.home_read_paths: "E6",
    m.device_keys: "E7",
    m.instance_keys: "E8",
    m.image_digest: "E11",
    m.healing_none: "E12",
    m.invocation_none: "E14",
}
"""Each step -> the era of the commit it is named after: the first whose records have what
it writes down (memory_keys: 74402cb's runtime_gb and process_gb, the last of its keys)."""


def oldest(file: str, era: str | None = None) -> Fixture:
    """The record `file` of `era`, by default of the oldest era that has it."""
    return next(f for f in FIXTURES if f.file == file and era in (None, f.era))


def test_every_format_1_step_is_tested() -> None:
    assert set(FIRST_ERA_WITH) | {m.errors_as_problems} == set(m.FORMAT_1_STEPS)
    assert {
        1: (*m.FORMAT_1_STEPS, m.typed_plan),
        2: (m.words_from_invocation,),
        3: (m.one_endpoint_type,),
        m.RECORD_FORMAT: (),
    } == m.STEPS


FORMAT_1 = [f for f in FIXTURES if m.record_format(f.raw) == 1]
"""The records of E1-E14: format 1's steps are for them (`migrate` runs no step of a format
on a record of a later one)."""


def test_records_are_format_1_up_to_e14_then_one_format_an_era() -> None:
    for fixture in FIXTURES:
        era = era_number(fixture.era)
        assert m.record_format(fixture.raw) == (1 if era <= 14 else era - 13 if era < 17 else 4)


def _processes(record: dict[str, Any]) -> list[dict[str, Any]]:
    decisions = record["plan"]["decisions"]
    if "servers" in decisions:
        return list(decisions["servers"])
    if decisions["kind"] == "set":
        return list(decisions["instances"]["members"])
    return [decisions]


def test_format_3_stores_no_copy_of_a_planned_invocation() -> None:
    """A plan the planner made (the golden records) stores its typed invocation alone from
    format 3 on: its words, dtype, address, port, served name, context, sequences, batch,
    OpenMP CPUs, eager and tensor parallelism are read from it, and they are what format 2
    stored beside it for the same plans. Hand-made decisions without an invocation's words
    keep theirs."""
    by_era: dict[int, dict[str, Fixture]] = {}
    for fixture in FIXTURES:
        by_era.setdefault(era_number(fixture.era), {})[fixture.file] = fixture
    newest, before = by_era[16], by_era[15]
    # the golden cases of both eras (a case added since has no format 3 record to compare)
    planned = [name for name in newest if name.startswith("golden-") and name in before]
    assert len(planned) >= 10
    for name in planned:
        processes = _processes(newest[name].raw)
        copies = {"vllm_args", "port", "max_model_len", "max_num_seqs", "enforce_eager", "omp_cpus"}
        assert all(not copies & set(p) and p["invocation"] for p in processes), name
        approval = Approval.model_validate(m.migrate(before[name].raw))
        stored = [p["vllm_args"] for p in _processes(before[name].raw)]
        made_now = [vllm_argv(VllmInvocation.model_validate(p["invocation"])) for p in processes]
        assert made_now == stored, name
        servers = approval.plan.decisions.servers
        assert [getattr(d, "recorded_vllm_args", None) for d in servers] == stored, name
        for kept, process in zip(_processes(before[name].raw), processes, strict=True):
            kind = VllmInstinctServer if process["kind"] == "instinct" else VllmCpuServer
            read = kind.model_validate(process)
            assert read.invocation is not None
            facts = kind.invocation_facts(read.invocation)
            assert (
                facts
                == {key: kept[key] for key in facts}
                == {key: getattr(read, key) for key in facts}
            ), name
            for field, nested in kind.nested_invocation_facts(read.invocation).items():
                assert not set(nested) & set(process[field]), (name, field)
                assert {key: kept[field][key] for key in nested} == nested, (name, field)
                read_back = getattr(read, field).model_dump(mode="json")
                assert {key: read_back[key] for key in nested} == nested, (name, field)
    assert all(
        "vllm_args" in p for name in newest if name.startswith("cases-")
        for p in _processes(newest[name].raw)
    )  # fmt: skip


def test_format_4_stores_what_the_servers_share_once() -> None:
    """A plan the planner made stores, from format 4 on, one endpoint: its service and what
    its servers share at the top, once, and each server only what is its own. Read back, it
    is the endpoint that format 3 stored, for the same plans."""
    by_era: dict[int, dict[str, Fixture]] = {}
    for fixture in FIXTURES:
        by_era.setdefault(era_number(fixture.era), {})[fixture.file] = fixture
    newest, before = by_era[max(by_era)], by_era[16]
    assert m.record_format(newest["golden-genoa-podman.json"].raw) == 4
    # the golden cases of both eras (a case added since has no format 3 record to compare)
    planned = [name for name in newest if name.startswith("golden-") and name in before]
    assert len(planned) >= 10
    for name in planned:
        decisions = newest[name].raw["plan"]["decisions"]
        for server in decisions["servers"]:
            repeated = {k for k, v in server.items() if k in decisions and decisions[k] == v}
            assert not repeated, (name, repeated)
        read = Approval.model_validate(m.migrate(newest[name].raw)).plan.decisions
        was = Approval.model_validate(m.migrate(before[name].raw)).plan.decisions
        assert read.servers == was.servers and read.instances == was.instances, name
        assert read.model_dump(exclude={"servers"}) == was.model_dump(exclude={"servers"}), name
        stored = len(set(decisions) - {"servers", "instances"}) + sum(
            map(len, decisions["servers"])
        )
        flat = before[name].raw["plan"]["decisions"]
        members = flat.get("instances", {}).get("members", []) if flat.get("instances") else []
        was_stored = len(set(flat) - {"instances"}) + sum(map(len, members))
        assert stored < was_stored if members else stored <= was_stored, (name, stored, was_stored)


def test_one_endpoint_type_moves_a_set_and_a_server() -> None:
    """Format 3's flat decisions become one endpoint: a set's members its servers, with its
    balancing beside them; one server's decisions its only server, kept whole."""
    for file in ("golden-instances-host-vllm.json", "golden-genoa-podman.json"):
        raw = oldest(file, "E16").raw
        flat = raw["plan"]["decisions"]
        moved = m.one_endpoint_type(raw)
        decisions = moved["plan"]["decisions"]
        assert moved["format"] == 4 and m.one_endpoint_type(moved) == moved
        if flat["kind"] == "set":
            assert decisions["servers"] == flat["instances"]["members"]
            assert "members" not in decisions["instances"] and "kind" not in decisions
        else:
            assert decisions["servers"] == [flat] and decisions.get("instances") is None


def test_typed_plan_moves_every_format_1_plan_and_only_those() -> None:
    """Every format-1 record's flat plan becomes `decisions` of its kind beside its units
    (data moved, nothing re-derived); a second run, and a format-2 record, are left as they
    are."""
    for fixture in FORMAT_1:
        record = fixture.raw
        for step in m.FORMAT_1_STEPS:
            record = step(record)
        typed = m.typed_plan(record)
        flat, plan = record["plan"], typed["plan"]
        assert typed["format"] == 2 and m.typed_plan(typed) == typed, fixture.id
        assert {k: plan[k] for k in m.PLAN_KEYS if k in plan} == {
            k: flat[k] for k in m.PLAN_KEYS if k in flat
        }, fixture.id
        decisions = plan["decisions"]
        kind = "set" if flat["instances"] else "instinct" if flat["device"] == "instinct" else "cpu"
        assert decisions["kind"] == kind, fixture.id
        for key, value in decisions.items():
            assert key == "kind" or flat[key] == value or key == "instances", (fixture.id, key)
    for fixture in FIXTURES:
        if m.record_format(fixture.raw) == 2:
            assert m.typed_plan(fixture.raw) == fixture.raw, fixture.id


def test_a_set_keeps_its_members_and_drops_member_0s_words() -> None:
    raw = oldest("golden-instances-podman-nps4.json", "E14").raw
    flat = raw["plan"]
    decisions = m.typed_plan(raw)["plan"]["decisions"]
    assert not {"vllm_args", "env", "socket", "cpus", "memory", "invocation"} & set(decisions)
    members = decisions["instances"]["members"]
    assert [m_["vllm_args"] for m_ in members] == [
        m_["vllm_args"] for m_ in flat["instances"]["members"]
    ]
    assert {member["kind"] for member in members} == {"cpu"}


@pytest.mark.parametrize("step", list(FIRST_ERA_WITH), ids=lambda s: s.__name__)
def test_a_step_changes_exactly_the_records_before_its_commit(step: m.Step) -> None:
    """Detected by key presence: a record from before the commit gets the key, a record
    from its era on (which has it) is left as it is, and a second run changes nothing."""
    first = era_number(FIRST_ERA_WITH[step])
    for fixture in FORMAT_1:
        once = step(fixture.raw)
        assert (once != fixture.raw) == (era_number(fixture.era) < first), fixture.id
        assert step(once) == once, fixture.id


def test_drop_exec_start_pre() -> None:
    raw = oldest("cases-genoa-podman.json").raw
    assert raw["plan"]["exec_start_pre"] and "exec_condition" not in raw["plan"]
    plan = m.drop_exec_start_pre(raw)["plan"]
    assert "exec_start_pre" not in plan
    assert plan["exec_condition"] == []


def test_listen_host_all() -> None:
    raw = oldest("cases-host-vllm.json").raw
    plan = m.listen_host_all(raw)["plan"]
    assert (plan["host"], plan["api_key_file"]) == ("0.0.0.0", None)


def test_tuning_keys() -> None:
    raw = oldest("cases-host-vllm.json").raw
    plan = m.tuning_keys(raw)["plan"]
    assert plan["omp_cpus"] == raw["plan"]["cpus"] == "0-47"
    assert {k: plan[k] for k in ("max_num_batched_tokens", "profile", "enforce_eager")} == {
        "max_num_batched_tokens": 2048,
        "profile": "balanced",
        "enforce_eager": False,
    }
    assert (plan["limit_nofile"], plan["limit_memlock"]) == (65536, "infinity")


def test_memory_keys_on_a_plan_and_each_member_of_a_set() -> None:
    for fixture in (oldest("cases-milan-docker.json"), oldest("golden-instances-host-vllm.json")):
        plan = m.memory_keys(fixture.raw)["plan"]
        fits = [plan["memory"]]
        if plan.get("instances"):
            fits += [member["memory"] for member in plan["instances"]["members"]]
        for fit in fits:
            assert (fit["runtime_gb"], fit["process_gb"]) == (0.0, 0.0)
            assert "kv_pool_cap_gb" in fit
    e1 = m.memory_keys(oldest("cases-milan-docker.json").raw)["plan"]["memory"]
    assert e1["kv_pool_cap_gb"] == 0


def test_errors_as_problems() -> None:
    """No stored record holds an error (approve refuses a plan with one), but E1-E4 plans
    held them as strings: one is a refusal, as `Problem.legacy` says."""
    raw = oldest("plans-chat.json").raw
    assert raw["plan"]["errors"] == []
    assert m.errors_as_problems(raw) == raw
    legacy = {**raw, "plan": {**raw["plan"], "errors": ["socket 3 gone"]}}
    [error] = m.errors_as_problems(legacy)["plan"]["errors"]
    assert Problem.model_validate(error) == Problem.legacy("socket 3 gone")
    assert (error["text"], error["exit_code"]) == ("socket 3 gone", 1)
    assert m.errors_as_problems(m.errors_as_problems(legacy)) == m.errors_as_problems(legacy)


def test_home_read_paths_device_instance_keys_image_digest_and_healing() -> None:
    raw = oldest("cases-genoa-podman.json").raw
    record = raw
    for step in (m.home_read_paths, m.device_keys, m.instance_keys, m.image_digest):
        record = step(record)
    record = m.healing_none(record)
    plan = record["plan"]
    assert plan["home_read_paths"] == []
    assert (plan["device"], plan["gpus"], plan["gfx_version"]) == ("cpu", [], None)
    assert (plan["tensor_parallel_size"], plan["gpu_fit"]) == (1, None)
    assert record["host_shape"]["gpus"] == {}
    assert (plan["instance"], plan["instances"]) == (None, None)
    assert record["image_digest"] is None
    assert plan["healing"] is None


def test_healing_none_on_each_member_of_a_set() -> None:
    plan = m.healing_none(oldest("golden-instances-podman-nps4.json", "E8").raw)["plan"]
    assert plan["healing"] is None
    assert [member["healing"] for member in plan["instances"]["members"]] == [None] * 4


KINDS: dict[str, type[BaseModel]] = {
    "cpu": VllmCpuServer,
    "instinct": VllmInstinctServer,
}


def fields(model: type[BaseModel]) -> set[str]:
    """The keys a record of today's format may hold: the fields, as they are serialized."""
    return {field.serialization_alias or name for name, field in model.model_fields.items()}


def kept_fields(model: type[BaseModel]) -> set[str]:
    """The keys every record holds: a field left out when empty (`exclude_if`: a format-2
    record's stored vLLM words) is absent from a record written since."""
    return {
        field.serialization_alias or name
        for name, field in model.model_fields.items()
        if field.exclude_if is None
    }


def in_invocation(decisions: dict[str, Any]) -> set[str]:
    """The keys a format-3 record leaves to the typed invocation of a vLLM process."""
    if decisions.get("invocation") is None or decisions["kind"] not in ("cpu", "instinct"):
        return set()
    kind = VllmInstinctServer if decisions["kind"] == "instinct" else VllmCpuServer
    return set(kind.invocation_facts(VllmInvocation.model_validate(decisions["invocation"])))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.id for f in FIXTURES])
def test_a_migrated_record_is_complete_and_has_nothing_else(fixture: Fixture) -> None:
    """Every field of the record's models is there after the steps, so no model default
    fills a gap; and nothing is left that today's models would silently drop."""
    record = m.migrate(fixture.raw)
    assert isinstance(record, dict)
    assert set(record) == fields(Approval)
    assert set(record["host_shape"]) == fields(HostShape)
    assert set(record["plan"]) == fields(Plan)
    decisions = record["plan"]["decisions"]
    servers = decisions["servers"]
    written = m.record_format(fixture.raw)
    assert isinstance(written, int)
    for index, each in enumerate(servers):
        kind = KINDS[each["kind"]]
        shared = shared_fields(kind)
        left = in_invocation(each) if written >= 3 else set()  # format 3: facts stored once
        if written >= 4:  # one endpoint: a server's record holds what is its own
            left |= {key for key in shared if key not in each}
            assert set(decisions) - {"servers", "instances"} <= shared, index
        assert kept_fields(kind) - left <= set(each) <= fields(kind), index
        if each["kind"] == "cpu":
            memory = set(each["memory"])
            if in_invocation(each) and written >= 3:  # its context and sequences: the invocation's
                memory |= {"context", "max_num_seqs"}
            assert memory == fields(MemoryFit), index
    assert Approval.model_validate(record).plan.endpoint == fixture.endpoint


def test_the_newest_records_need_no_step() -> None:
    for fixture in (f for f in FIXTURES if f.era == ERAS[-1]):
        assert m.migrate(fixture.raw) == fixture.raw, fixture.id


def test_migrated_plan_of_a_plan_alone() -> None:
    plan = oldest("cases-host-vllm.json").raw["plan"]
    upgraded = m.migrated_plan(plan)
    [flat] = upgraded["decisions"]["servers"]
    assert (flat["host"], flat["omp_cpus"]) == ("0.0.0.0", plan["cpus"])
    server = Plan.model_validate(upgraded).decisions.first
    assert isinstance(server, VllmCpuServer) and server.max_num_batched_tokens == 2048


def settings(tmp_path: Path) -> Settings:
    return Settings(
        config_dir=tmp_path / "etc",
        state_dir=tmp_path / "state",
        unit_dir=tmp_path / "systemd",
        quadlet_dir=tmp_path / "containers-systemd",
    )


def stored(tmp_path: Path, data: bytes, name: str = "qwen") -> tuple[Settings, Path]:
    config = settings(tmp_path)
    path = approval_path(config, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return config, path


def test_a_newer_format_is_refused_as_such(tmp_path: Path) -> None:
    raw = {**oldest("cases-genoa-podman.json", ERAS[-1]).raw, "format": m.RECORD_FORMAT + 1}
    newer = rf"^written by a newer epyc-llm \(format {m.RECORD_FORMAT + 1}"
    with pytest.raises(InputError, match=newer) as direct:
        m.migrate(raw)
    assert direct.value.fix == "upgrade epyc-llm"
    config, path = stored(tmp_path, json.dumps(raw).encode())
    with pytest.raises(InputError) as loading:
        load_approval(config, "qwen")
    assert loading.value.file == str(path)
    assert re.match(newer, loading.value.message)
    assert loading.value.fix is not None and loading.value.fix.startswith("upgrade epyc-llm")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xff\xfe", "not UTF-8 text"),
        (b"", "not JSON"),
        (b'{"format": 1, "endpoint": "qwen"', "not JSON"),
        (b"[1, 2]", "valid dictionary"),
        (b'"qwen"', "valid dictionary"),
        (b'{"format": "1", "endpoint": "qwen"}', f"Input should be {m.RECORD_FORMAT}"),
        (b'{"format": 0, "endpoint": "qwen"}', f"Input should be {m.RECORD_FORMAT}"),
        (b'{"endpoint": "qwen"}', "Field required"),
    ],
)
def test_garbage_is_a_damaged_record(tmp_path: Path, data: bytes, problem: str) -> None:
    config, path = stored(tmp_path, data)
    with pytest.raises(InputError) as caught:
        load_approval(config, "qwen")
    assert caught.value.message.startswith("damaged approval record: ")
    assert problem in caught.value.message
    assert caught.value.file == str(path)
    assert caught.value.fix == (
        "`epycctl approve qwen` replaces it, or `epycctl remove qwen` deletes it"
    )


def test_a_cut_short_record_of_each_era_is_damaged(tmp_path: Path) -> None:
    for era in ERAS:
        fixture = oldest("cases-genoa-podman.json", era)
        data = fixture.path.read_bytes()
        config, _ = stored(tmp_path / era, data[: len(data) // 2])
        with pytest.raises(InputError) as caught:
            load_approval(config, "qwen")
        assert caught.value.message.startswith("damaged approval record: not JSON: "), era


def test_a_record_over_8_mib_is_not_read(tmp_path: Path) -> None:
    raw = oldest("cases-genoa-podman.json").raw
    padded = json.dumps(raw)[:-1] + ', "padding": "' + "x" * RECORD_MAX_BYTES + '"}'
    config, path = stored(tmp_path, padded.encode())
    with pytest.raises(InputError, match="larger than 8 MiB") as caught:
        load_approval(config, "qwen")
    assert caught.value.file == str(path)


def test_loading_an_old_record_does_not_rewrite_it(tmp_path: Path) -> None:
    fixture = oldest("cases-genoa-podman.json")
    config, path = stored(tmp_path, fixture.path.read_bytes())
    config = config.model_copy(
        update={
            "unit_dir": Path(fixture.root) / "systemd",
            "quadlet_dir": Path(fixture.root) / "containers-systemd",
        }
    )
    before = path.stat()
    approval = load_approval(config, "qwen")
    assert approval is not None and approval.plan.decisions.host == m.LEGACY_HOST
    assert path.read_bytes() == fixture.path.read_bytes()
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_a_record_without_format_is_format_1() -> None:
    raw: dict[str, Any] = dict(oldest("cases-genoa-podman.json", ERAS[-1]).raw)
    del raw["format"]
    record = m.migrate(raw)
    assert isinstance(record, dict)
    assert record["format"] == m.RECORD_FORMAT
    assert Approval.model_validate(record).plan.decisions.kind == "cpu"


def test_the_unit_time_readers_load_no_renderer() -> None:
    """The boot check, the crash recorder and the balancer's gate read records at every
    start and stop: reading one (migration included) must not pull in the renderer."""
    code = (
        "import sys, epycd.approval.check, epycd.approval.crashloop, epycd.approval.ready;"
        "print(sorted(m for m in sys.modules if m.startswith('epycd.render')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.strip() == "[]"
