"""`epycctl export kube NAME`: YAML on stdout (notes as comments and on stderr), --output's
files (never overwritten without --force), --json, the errors of a local model folder
without a volume; and no secret's value in any of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from epycd.cli import main
from epycd.cli.export import stdout_text
from epycd.export import export_kube
from epycd.host import runtimes
from epycd.host.facts import RuntimeFacts
from epycd.stack import shipped_stack
from tests.hosts import make_host
from tests.plan.conftest import PODMAN_5, PlanWorkspace, fake_host
from tests.secrets import root_folder

API_KEY = "sk-export-test-KEY-7f3a9c"
HF_TOKEN = "hf_exportTestTOKEN_51d2e8"


@pytest.fixture(autouse=True)
def podman_5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtimes, "probe_runtimes", lambda vllm=None: RuntimeFacts(podman=PODMAN_5))


def run(ws: PlanWorkspace, root: Path, *args: str) -> Result:
    env = {
        "EPYCD_CONFIG_DIR": str(ws.config_dir),
        "EPYCD_UNIT_DIR": str(ws.settings.unit_dir),
        "EPYCD_QUADLET_DIR": str(ws.settings.quadlet_dir),
        "EPYCD_STATE_DIR": str(ws.settings.state_dir),
        "EPYCD_RUN_DIR": str(ws.settings.run_dir),
        "EPYCD_HOST_ROOT": str(root),
        "HF_HOME": str(ws.hf_home),
    }
    return CliRunner().invoke(main, ["export", "kube", *args], env=env, catch_exceptions=False)


@pytest.fixture
def ws(tmp_path: Path) -> PlanWorkspace:
    return PlanWorkspace(tmp_path)


@pytest.fixture
def milan(ws: PlanWorkspace, tmp_path: Path) -> Path:
    ws.endpoint("llm", "socket = 0\n")
    return make_host(tmp_path / "hosts", "milan-7763-2s")


def test_stdout_is_yaml_with_the_notes(ws: PlanWorkspace, milan: Path) -> None:
    result = run(ws, milan, "llm", "--model-volume", "models")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# epyc-llm llm: written by epycctl export kube; notes:")
    documents = list(yaml.safe_load_all(result.stdout))
    kinds = [document["kind"] for document in documents]
    assert kinds == ["Deployment", "Service", "KubeletConfiguration"]
    volume = documents[0]["spec"]["template"]["spec"]["volumes"][0]
    assert volume == {"name": "model", "persistentVolumeClaim": {"claimName": "models",
                                                                 "readOnly": True}}  # fmt: skip
    mount = documents[0]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["mountPath"] == str(ws.model)
    assert "note: VLLM_CPU_OMP_THREADS_BIND=" in result.stderr
    assert not ws.settings.unit_dir.exists() and not ws.settings.quadlet_dir.exists()


def test_json(ws: PlanWorkspace, milan: Path) -> None:
    result = run(ws, milan, "llm", "--model-volume", "models", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"objects", "kubelet_config", "notes"}
    assert [o["kind"] for o in data["objects"]] == ["Deployment", "Service"]
    assert data["kubelet_config"]["cpuManagerPolicy"] == "static"


def test_output_writes_one_file_per_object_and_never_overwrites(
    ws: PlanWorkspace, milan: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "out"
    result = run(ws, milan, "llm", "--model-volume", "models", "--output", str(folder))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    names = sorted(path.name for path in folder.iterdir())
    assert names == ["NOTES.txt", "deployment-epyc-llm-llm.yaml", "kubelet-config.yaml",
                     "service-epyc-llm-llm.yaml"]  # fmt: skip
    deployment = yaml.safe_load((folder / "deployment-epyc-llm-llm.yaml").read_text())
    assert deployment["kind"] == "Deployment"
    assert yaml.safe_load((folder / "kubelet-config.yaml").read_text())["kind"] == (
        "KubeletConfiguration"
    )
    (folder / "service-epyc-llm-llm.yaml").write_text("mine\n")
    again = run(ws, milan, "llm", "--model-volume", "models", "--output", str(folder))
    assert again.exit_code == 1 and "--force" in again.stderr, again.output
    assert (folder / "service-epyc-llm-llm.yaml").read_text() == "mine\n"
    forced = run(ws, milan, "llm", "--model-volume", "models", "--output", str(folder), "--force")
    assert forced.exit_code == 0, forced.output
    assert yaml.safe_load((folder / "service-epyc-llm-llm.yaml").read_text())["kind"] == "Service"


def test_a_local_folder_needs_a_model_volume(ws: PlanWorkspace, milan: Path) -> None:
    result = run(ws, milan, "llm")
    assert result.exit_code == 2, result.output
    assert "llm.toml: model:" in result.stderr and "--model-volume CLAIM" in result.stderr


def test_an_endpoint_over_several_numa_nodes_is_refused_with_the_fix(
    ws: PlanWorkspace, tmp_path: Path
) -> None:
    ws.endpoint("wide", "socket = 1\n")
    root = make_host(tmp_path / "hosts", "genoa-9654-2s-nps4")
    result = run(ws, root, "wide", "--model-volume", "models")
    assert result.exit_code == 1, result.output
    assert "wide.toml" in result.stderr and 'instances = "auto"' in result.stderr


def test_an_unknown_endpoint(ws: PlanWorkspace, milan: Path) -> None:
    result = run(ws, milan, "nope")
    assert result.exit_code == 2 and "no endpoint file nope.toml" in result.stderr


def test_no_secret_value_in_any_output(tmp_path: Path) -> None:
    """An endpoint with an api_key_file and an hf_token_file holding known strings: the
    objects refer to Secrets by name, and neither string is in the YAML, JSON or notes."""
    with root_folder() as folder:
        ws = PlanWorkspace(folder)
        for name, value in (("key", API_KEY), ("token", HF_TOKEN)):
            (folder / name).write_text(value + "\n")
            (folder / name).chmod(0o600)
        ws.endpoint("sec", f'api_key_file = "{folder}/key"\nhf_token_file = "{folder}/token"\n')
        host = fake_host(folder, "milan-7763-2s")
        plan = ws.plan(host)["sec"].plan
        assert plan is not None
        for kserve in (False, True):
            done = export_kube(plan, host, shipped_stack(), kserve=kserve, model_volume="m")
            texts = [stdout_text("sec", done), json.dumps(done.as_json()), *done.notes]
            for text in texts:
                assert API_KEY not in text and HF_TOKEN not in text
            dumped = json.dumps(done.objects)
            assert '"secretKeyRef": {"name": "epyc-llm-sec-api-key", "key": "api-key"}' in dumped
            assert '"secretKeyRef": {"name": "epyc-llm-sec-hf-token", "key": "hf-token"}' in dumped


def test_output_never_follows_a_link_planted_in_the_folder(
    ws: PlanWorkspace, milan: Path, tmp_path: Path
) -> None:
    """A link in DIR named like a file of the export, pointing anywhere: no file is created
    there, nor overwritten with --force; the link is refused, not followed."""
    folder, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    folder.mkdir(mode=0o755)
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    victim.write_text("precious\n")
    (folder / "NOTES.txt").symlink_to(elsewhere / "created-by-export")
    (folder / "kubelet-config.yaml").symlink_to(victim)
    result = run(ws, milan, "llm", "--model-volume", "models", "--output", str(folder))
    assert result.exit_code == 1, result.output
    forced = run(ws, milan, "llm", "--model-volume", "models", "--output", str(folder), "--force")
    assert forced.exit_code == 1 and "not a regular file" in forced.stderr, forced.output
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim"]
    assert victim.read_text() == "precious\n"
    assert (folder / "kubelet-config.yaml").is_symlink()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_output_refuses_a_folder_others_can_write(
    ws: PlanWorkspace, milan: Path, tmp_path: Path, mode: int
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    result = run(ws, milan, "llm", "--model-volume", "models", "--output", str(folder))
    assert result.exit_code == 1, result.output
    assert str(folder) in result.stderr and "chmod go-w" in result.stderr, result.stderr
    assert list(folder.iterdir()) == []


def test_output_creates_its_folder_for_the_admin_alone_whatever_the_umask(
    ws: PlanWorkspace, milan: Path, tmp_path: Path
) -> None:
    old = os.umask(0o002)
    try:
        result = run(
            ws, milan, "llm", "--model-volume", "models", "--output", str(tmp_path / "new")
        )
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "new" / "NOTES.txt").is_file()
