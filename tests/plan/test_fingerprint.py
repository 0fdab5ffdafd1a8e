"""The fingerprint: stable across runs on an unchanged host, moved by every shaping input;
and the exact values of today's planner for the golden cases."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest

from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, RuntimeFacts
from epycd.plan.pipeline.fingerprint import canonical_json, fingerprint, fingerprint_inputs
from epycd.stack import parse_stack, shipped_stack, stack_path
from tests.hosts import CATALOGUE, write_host
from tests.plan.conftest import PODMAN_5, PlanWorkspace
from tests.render.test_golden import CASES as GOLDEN_CASES
from tests.render.test_golden import plan_results
from tests.secrets import root_controlled_chain

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
        decisions=plan.plan.decisions,
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
        decisions=result.plan.decisions,
    )
    assert fingerprint(inputs) == result.plan.fingerprint
    text = canonical_json(inputs)
    assert "memory_available" not in text and "busy" not in text


PINNED_FOLDER = Path("/srv/epyc-llm-pinned-fingerprints")
"""Where the golden cases are planned for their pinned fingerprints. Paths are inputs: the
model's local_path (the HF cache's snapshot folder) and the bytes of an endpoint file naming a
key or token file are in the inputs fingerprint, and the units and their folders in the full
one; so every run plans in this same folder (each value below depends on its name). A folder
only root controls, as key and token files need (tests/secrets.py)."""


class Pinned(NamedTuple):
    inputs_fingerprint: str
    fingerprint: str


PINNED: dict[str, dict[str, Pinned]] = {
    "docker-exposed-key": {
        "olmo-key": Pinned(
            "eaaecbd3ec99bb1d32102257c95ce79f9f1140f2002f6790b9f58c1ce38e2a2f",
            "ec12c0cd779c82c65783487f81e6d53c5a4d925d7067c43ff75b00508d5ff134",
        ),
    },
    "extra-args-consent": {
        "qwen": Pinned(
            "cb055a7d46f52fd1ec91e8ddb8f739bbcadc8d72474ef1b34271c137b20abbd4",
            "90ca82da4e87d815741d1b87591aa13cddaf0dc0f80ee1016d0889efed7d087f",
        ),
    },
    "gated-podman-token": {
        "llama": Pinned(
            "a2efd49289f888f5073fe223fdea63d7458a67b1af944b0fba0294ee41253954",
            "9b683687be0edf253516ffc6398045b4d431323e1ad171ef5ed7c908eeffda84",
        ),
    },
    "genoa-podman": {
        "qwen": Pinned(
            "f95b67425a5107589dcfbe573ac6295df4198ed0616110a9ce1066c902c31298",
            "6842b1f8b7b9debd13397b3bdaafc5b1c09519ea98060c87ca2869df9b9bab4f",
        ),
    },
    "host-ipv6-key": {
        "host-key": Pinned(
            "276a32547f324d068059f1028e49fd81e1798f915a04cae4bb0b21db96bd30fb",
            "63d935dd1e41f75641330a2cffe6a5e2782a718db93be90ab9f2909cf3838bc5",
        ),
    },
    "host-vllm": {
        "host-qwen": Pinned(
            "0239f6600ea5fee6311cd447174b0574d2589ce8f733f5ef2a5866f77e21c5fa",
            "9b9145c826de0eaa11b2b485b31aec79f139f4ae6a93b16c1f66d6f3a1a6bd7b",
        ),
    },
    "host-vllm-token": {
        "host-llama": Pinned(
            "6178bb2e0b331650d4836f0b02f2023967699e46f6fec08f91634d9ab1fa0d10",
            "0298d3e7fccd5fd7998a8bafb1d38cfeb1c0301ca62d52b6072541677b39e13b",
        ),
    },
    "instances-docker-milan": {
        "olmo": Pinned(
            "91a2fb74245d325c6c3a3231eedd0d037e9c24cba0d8814ca937f5b0d3dd286b",
            "348a44d30f8def7337c76099a56e24bd5c61583594a6e10a14bfa71fe899c792",
        ),
    },
    "instances-host-vllm": {
        "multi": Pinned(
            "5eebe0e8973fa50c0ecdeede4c50921132a4b3d136ce25c1a4209e4add45ba75",
            "e82eff86af3bbf29cfd5bfeb569e05182ec14b0182325b0902318cf3de40a9fb",
        ),
    },
    "instances-podman-nps4": {
        "qwen": Pinned(
            "6720ef5722bcd78b6d8ebfdff58922e462a380ce7dd86103f1f7e9324461ed66",
            "afa9946e7e7129df9856270c379ec5dbd1602cb632db1c4eabc71af63a042f24",
        ),
    },
    "instinct-mi210-podman": {
        "qwen": Pinned(
            "3ff1dd17b7d162f69c6153f73be9611af79ef5e89c6b9b424977ba073b388bed",
            "8535bd0cdcade48a7200681d4a6aaeb044e54bcea85a4999437c4581531156c6",
        ),
    },
    "instinct-mi300x-podman": {
        "cpu": Pinned(
            "d67dbc0f13aaecb541127a4acfddb1df09819a8d5c4eafdc7dc8bb2790827a9f",
            "3a949960b61958300201b303c17f9c37eb854ca4a03faf69051dc8d630fb5364",
        ),
        "gpu": Pinned(
            "5967c65c75076115af0351d8888e4cb8007ec1ffc7bf81057f69684726058a12",
            "f4b08a2257b2d9d796130585cd146972a30f7a431150c8af4d240bb53d677254",
        ),
    },
    "instinct-mi355x-docker": {
        "llama": Pinned(
            "c536697020a6f2a7ec4e73fce555746c23ec68ad0c3a94aae523c5392f45b004",
            "1d33bf94de186baa28e118d524d4406aee7696636a7ad79e3c65a3a31840ca11",
        ),
    },
    "milan-docker": {
        "olmo": Pinned(
            "5c186142de4f848f3df5800edbf110046ea95c490a80f9a21f50fd4db8caa0f8",
            "c3630a428d55e0558ed6f1874c8ae69eb3930c18535217e801981852a0da9eb3",
        ),
    },
    "podman-before-5": {
        "qwen-old": Pinned(
            "d67dbc0f13aaecb541127a4acfddb1df09819a8d5c4eafdc7dc8bb2790827a9f",
            "85409d55780e4a38680daa0f99af62b1fed197a573c12877ae2eb73cc1ba39f9",
        ),
    },
    "podman-before-5-key": {
        "qwen-key": Pinned(
            "824d858eaea353bb3a8e03296b375753730d38a419da9ca1f6c69d7ebe3286de",
            "44ad3004894b651a948be242d9132aba70fc7d6b65a255715b359a30d94f86ef",
        ),
    },
    "pooling-podman": {
        "embed": Pinned(
            "2df0088f859e82eb37c336fb1af3c768f94e161e6320cfe59863970a949c7612",
            "4f27e8a75e5e0d368b69fd0166093a7bbd2ffb07d20df9880e1b9c510eba8265",
        ),
        "rerank": Pinned(
            "f5c281df7ad5b3769d54789ad7b752d68de6229d91e1257ac4013f647007ef90",
            "cc4dced058d377b6938b01793f805bc28326545b101347b529caf9f21d58af2e",
        ),
    },
}
"""Each golden case's endpoints as today's planner fingerprints them in PINNED_FOLDER.
`inputs_fingerprint` is what drift compares with an approved record (approval/state.py): a
change marks every approved endpoint changed-needs-approval, so it moves only with the endpoint
file, data/, the model or the host's shape, never with a refactor. `fingerprint` also hashes
the units (tests/golden/CASE/expected) and their folders."""


@contextmanager
def pinned_folder() -> Iterator[Path]:
    """PINNED_FOLDER, new and empty, for one test at a time (runs in parallel take turns)."""
    if os.geteuid() != 0:
        pytest.skip("the golden cases' key and token files are root's: run the tests as root")
    if not (PINNED_FOLDER.parent.is_dir() and root_controlled_chain(PINNED_FOLDER.parent)):
        pytest.skip(f"{PINNED_FOLDER.parent} is not a folder only root controls")
    lock_path = Path(tempfile.gettempdir()) / f"{PINNED_FOLDER.name}.lock"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(PINNED_FOLDER, ignore_errors=True)
        PINNED_FOLDER.mkdir(mode=0o755)
        PINNED_FOLDER.chmod(0o755)
        try:
            yield PINNED_FOLDER
        finally:
            shutil.rmtree(PINNED_FOLDER, ignore_errors=True)


def test_every_golden_case_is_pinned() -> None:
    assert sorted(PINNED) == GOLDEN_CASES


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_the_golden_cases_fingerprints_are_pinned(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pinned_folder() as folder:
        results = plan_results(case, folder, monkeypatch)
    found = {}
    for name, result in results.items():
        assert result.plan is not None
        found[name] = Pinned(result.plan.inputs_fingerprint, result.plan.fingerprint)
    assert found == PINNED.get(case)
