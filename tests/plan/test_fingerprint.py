"""The fingerprint: stable across runs on an unchanged host, moved by every shaping input."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.plan.fingerprint import canonical_json, fingerprint, fingerprint_inputs
from epycd.stack import parse_stack, shipped_stack, stack_path
from tests.hosts import CATALOGUE, write_host
from tests.plan.conftest import PODMAN_5, PlanWorkspace

GIB = 1024**3


def host_at(root: Path, name: str = "genoa-9654-2s-nps4", **changes: object) -> HostFacts:
    write_host(root, replace(CATALOGUE[name], **changes))  # type: ignore[arg-type]
    host = detect_host(root, probe_runtimes=False)
    return host.model_copy(update={"runtimes": RuntimeFacts(podman=PODMAN_5)})


def prints(ws: PlanWorkspace, host: HostFacts, **kwargs: object) -> dict[str, str]:
    out = {}
    for name, result in ws.plan(host, **kwargs).items():
        assert result.plan is not None, [p.text for p in result.errors]
        out[name] = result.plan.fingerprint
    return out


def test_two_runs_agree(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a")
    ws.endpoint("b", "socket = 1\n")
    first = prints(ws, host_at(tmp_path / "h1"))
    second = prints(ws, host_at(tmp_path / "h2"))
    assert first == second and len(set(first.values())) == 2
    assert all(len(value) == 64 for value in first.values())


def test_volatile_figures_do_not_move_it(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a", "socket = 0\n")
    host = host_at(tmp_path / "h")
    before = prints(ws, host)
    nodes = [
        n.model_copy(update={"memory_available_bytes": n.memory_available_bytes - GIB // 4})
        for n in host.nodes
    ]
    busier = host.model_copy(
        update={"socket_busy_pct": {0: 12.0, 1: 70.0}, "nodes": nodes, "warnings": ["x"]}
    )
    assert prints(ws, busier) == before


def test_an_endpoint_file_edit_moves_only_its_own(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a")
    ws.endpoint("b", "socket = 1\n")
    host = host_at(tmp_path / "h")
    before = prints(ws, host)
    ws.endpoint("b", "socket = 1\nmax_num_seqs = 2\n")
    after = prints(ws, host)
    assert after["a"] == before["a"] and after["b"] != before["b"]
    ws.endpoint("b", "socket = 1\n# a comment is an edit too\n")
    assert prints(ws, host)["b"] not in (before["b"], after["b"])


def test_a_host_core_count_change_moves_it(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a", "socket = 0\n")
    full = prints(ws, host_at(tmp_path / "h96"))
    fewer = prints(ws, host_at(tmp_path / "h64", cores_per_socket=64))
    assert full["a"] != fewer["a"]


def test_a_stack_change_moves_it(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a", "socket = 0\n")
    host = host_at(tmp_path / "h")
    data = json.loads(stack_path().read_text())
    data["kv_cache_dtype_note"] += " (edited)"
    edited = parse_stack(json.dumps(data).encode(), source="edited.json")
    assert prints(ws, host, stack=edited) != prints(ws, host)


def test_model_facts_revision_moves_it(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a", "socket = 0\n")
    host = host_at(tmp_path / "h")
    plan = ws.plan(host)["a"]
    assert plan.plan is not None and plan.model_facts is not None
    base = dict(
        units=plan.plan.units,
        unit_dirs=plan.plan.unit_dirs,
        spec_sha256="0" * 64,
        stack_sha256="1" * 64,
        host=host,
        decisions=plan.plan,
    )
    moved = plan.model_facts.model_copy(update={"revision": "another-commit"})
    first = fingerprint(fingerprint_inputs(model=plan.model_facts, **base))  # type: ignore[arg-type]
    second = fingerprint(fingerprint_inputs(model=moved, **base))  # type: ignore[arg-type]
    assert first != second


def test_the_hash_is_over_canonical_json_of_the_inputs(ws: PlanWorkspace, tmp_path: Path) -> None:
    ws.endpoint("a", "socket = 0\n")
    host = host_at(tmp_path / "h")
    result = ws.plan(host)["a"]
    assert result.plan is not None and result.model_facts is not None
    inputs = fingerprint_inputs(
        units=result.plan.units,
        unit_dirs=result.plan.unit_dirs,
        spec_sha256=hashlib.sha256((ws.config_dir / "a.toml").read_bytes()).hexdigest(),
        stack_sha256=shipped_stack().content_sha256,
        model=result.model_facts,
        host=host,
        decisions=result.plan,
    )
    assert fingerprint(inputs) == result.plan.fingerprint
    text = canonical_json(inputs)
    assert "memory_available" not in text and "busy" not in text
