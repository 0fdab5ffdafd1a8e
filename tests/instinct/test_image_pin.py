"""What an approval binds does not float (docs/instinct.md, "The image an approval binds"): the
Instinct image is a pinned tag of the ROCm vLLM image (v0.25.1, the vLLM of data/epyc.json whose
architecture tables the plan checks), and approve records the image the engine holds (`image
inspect --format {{.Id}}`) in the approval record, shown by `status --json`; an image not
present is recorded as unknown (null), and a record older than the field still loads."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epycd.approval.record import load_approval
from epycd.host.facts import HostFacts
from epycd.model.instinct import floats, shipped_recipes
from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.plans import make_plan
from tests.plan.conftest import PlanWorkspace
from tests.sandbox import make_executable

PINNED = "docker.io/vllm/vllm-openai-rocm:v0.25.1"
IMAGE_ID = "4f" * 32

FAKE_PODMAN = """#!/bin/sh
echo "$*" >> {log}
case "$1 $2" in
  "image inspect") [ -n "{image_id}" ] || exit 125; echo "{image_id}" ;;
  "pull "*) ;;
esac
exit 0
"""


def test_the_shipped_image_is_pinned_and_renders_as_such(
    ws: PlanWorkspace, host_of: Callable[..., HostFacts]
) -> None:
    assert shipped_recipes().docker_image == PINNED and not floats(PINNED)
    host = host_of("genoa-2s-8x-mi300x")
    ws.endpoint("gpu", 'device = "instinct"\nmodel = "Qwen/Qwen3-0.6B"\ngpus = [4]\n')
    result = ws.plan(host)["gpu"]
    assert result.plan is not None, [p.text for p in result.errors]
    assert result.plan.decisions.image == PINNED
    assert f"Image={PINNED}\n" in result.plan.units["epyc-llm-gpu.container"]
    assert not any("not pinned" in warning for warning in result.plan.decisions.warnings)


def test_floating_references() -> None:
    assert floats("docker.io/vllm/vllm-openai-rocm:latest") and floats("vllm/vllm-openai-rocm")
    assert floats("localhost:5000/vllm")
    assert not floats("localhost:5000/vllm:v0.25.1")
    assert not floats("vllm/vllm-openai-rocm@sha256:" + "0" * 64)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    yield make_env(tmp_path, monkeypatch)


def approve_podman(env: ApprovalSandbox, image_id: str, *args: str) -> dict[str, object]:
    log = env.tmp / "podman.log"
    make_executable(env.bin_dir / "podman", FAKE_PODMAN.format(log=log, image_id=image_id))
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir, runtime="podman"))
    done = env.epycctl("approve", "chat", "--yes", "--no-start", *args)
    assert done.returncode == 0, done.stderr
    record = json.loads((env.settings.state_dir / "approvals" / "chat.json").read_text())
    assert isinstance(record, dict)
    return record


def test_approve_records_the_digest_of_the_image_present(env: ApprovalSandbox) -> None:
    record = approve_podman(env, IMAGE_ID)
    assert record["image_digest"] == f"sha256:{IMAGE_ID}"
    calls = (env.tmp / "podman.log").read_text().splitlines()
    assert calls[0].startswith("pull ")
    assert calls[-1] == "image inspect --format {{.Id}} docker.io/amdih/zendnn_zentorch:test"
    shown = env.epycctl("status", "chat", "--json")
    assert shown.returncode == 0, shown.stderr
    [status] = json.loads(shown.stdout)["endpoints"]
    assert status["image_digest"] == f"sha256:{IMAGE_ID}"
    assert status["image"] == "docker.io/amdih/zendnn_zentorch:test"
    text = env.epycctl("status", "chat")
    assert f"sha256:{IMAGE_ID}" in text.stdout


def test_an_image_not_present_is_recorded_as_unknown(env: ApprovalSandbox) -> None:
    record = approve_podman(env, "", "--no-pull")
    assert record["image_digest"] is None
    shown = env.epycctl("status", "chat")
    assert "digest unknown" in shown.stdout


def test_a_record_older_than_the_field_still_loads(env: ApprovalSandbox) -> None:
    approve_podman(env, IMAGE_ID)
    path = env.settings.state_dir / "approvals" / "chat.json"
    record = json.loads(path.read_text())
    del record["image_digest"]
    path.write_text(json.dumps(record))
    approval = load_approval(env.settings, "chat")
    assert approval is not None and approval.image_digest is None
