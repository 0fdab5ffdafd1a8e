"""`epycctl plan NAME`: the confirmation table, the plan keys of docs/architecture.md, exit codes.

The fake hosts stand for machines with podman 5 (Quadlet): this machine has podman 4.3
without Quadlet and no docker daemon, so the runtime probe of `detect_host` is replaced by
podman 5 facts here; the real probe is used by the test at the end (real vLLM venv).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from epycd.cli import main
from epycd.host import runtimes
from epycd.host.facts import RuntimeFacts
from tests.health.realvllm import tiny_model, vllm_executable
from tests.hosts import make_host
from tests.machine import expand, physical_cpus_of_socket, serving
from tests.plan.conftest import PODMAN_5, PlanWorkspace

DESIGN_KEYS = {
    "endpoint", "model", "model_kind", "primary_endpoint", "backend", "runtime", "image",
    "dtype", "socket", "cpus", "numa_nodes", "env", "kv_cache_gb", "memory", "port",
    "max_model_len", "requires_confirmation", "confirmation_reasons", "warnings", "errors",
    "units", "fingerprint",
}  # fmt: skip
MEMORY_KEYS = {"weights_gb", "kv_gb", "required_gb", "available_gb", "fits",
               "suggested_max_model_len", "runtime_gb", "process_gb", "headroom_gb"}  # fmt: skip


@pytest.fixture
def podman_5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtimes, "probe_runtimes", lambda vllm=None: RuntimeFacts(podman=PODMAN_5))


def run(ws: PlanWorkspace, *args: str) -> Result:
    env = {
        "EPYCD_CONFIG_DIR": str(ws.config_dir),
        "EPYCD_UNIT_DIR": str(ws.settings.unit_dir),
        "EPYCD_QUADLET_DIR": str(ws.settings.quadlet_dir),
        "EPYCD_STATE_DIR": str(ws.settings.state_dir),
        "EPYCD_RUN_DIR": str(ws.settings.run_dir),
        "HF_HOME": str(ws.hf_home),
    }
    return CliRunner().invoke(main, ["plan", *args], env=env, catch_exceptions=False)


@pytest.mark.usefixtures("podman_5")
def test_json_has_the_design_keys_and_only_the_named_endpoint(
    ws: PlanWorkspace, tmp_path: Path
) -> None:
    root = make_host(tmp_path / "hosts", "genoa-9654-2s-nps4")
    ws.endpoint("a", "socket = 1\n")
    ws.endpoint("b")
    result = run(ws, "a", "--json", "--root", str(root))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) >= DESIGN_KEYS and set(data["memory"]) >= MEMORY_KEYS
    assert data["endpoint"] == "a" and data["socket"] == 1 and data["numa_nodes"] == [4, 5, 6, 7]
    assert data["backend"] == "zentorch" and data["runtime"] == "podman"
    assert data["errors"] == [] and list(data["units"]) == ["epyc-llm-a.container"]
    assert len(data["fingerprint"]) == 64
    assert data["env"]["VLLM_CPU_OMP_THREADS_BIND"] == data["omp_cpus"]
    assert expand(data["omp_cpus"]) == expand(data["cpus"])[:-2]
    again = json.loads(run(ws, "a", "--json", "--root", str(root)).output)
    assert again["fingerprint"] == data["fingerprint"]
    other = json.loads(run(ws, "b", "--json", "--root", str(root)).output)
    assert other["socket"] == 0 and other["port"] != data["port"]
    assert not ws.settings.unit_dir.exists() and not ws.settings.quadlet_dir.exists()


@pytest.mark.usefixtures("podman_5")
def test_table_follows_the_recipes_confirmation_step(ws: PlanWorkspace, tmp_path: Path) -> None:
    root = make_host(tmp_path / "hosts", "milan-7763-2s")
    ws.endpoint("llm", "socket = 1\n")
    result = run(ws, "llm", "--root", str(root))
    assert result.exit_code == 0, result.output
    out = result.output
    for label in ("Model / kind", "Backend", "Path", "Precision", "Memory fit", "CPU config",
                  "Hardware", "Port", "Consent needed"):  # fmt: skip
        assert label in out
    assert "stock vLLM CPU" in out and "socket 1 (forced by socket = 1)" in out
    assert "EPYC Milan" in out and "docker.io/vllm/vllm-openai-cpu:v0.25.1-x86_64" in out
    assert f"# {ws.settings.quadlet_dir}/epyc-llm-llm.container" in out
    assert "fingerprint " in out and "--accept-unvalidated" in out


@pytest.mark.usefixtures("podman_5")
def test_refused_host_exits_1(ws: PlanWorkspace, tmp_path: Path) -> None:
    root = make_host(tmp_path / "hosts", "xeon")
    ws.endpoint("llm")
    result = run(ws, "llm", "--json", "--root", str(root))
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert "not an AMD EPYC" in data["errors"][0] and data["units"] == {}
    assert data["fingerprint"] is None


@pytest.mark.usefixtures("podman_5")
def test_bad_file_exits_2_naming_file_and_key(ws: PlanWorkspace, tmp_path: Path) -> None:
    root = make_host(tmp_path / "hosts", "genoa-9654-2s-nps1")
    ws.endpoint("bad", "sockets = 1\n")
    ws.endpoint("good")
    bad = run(ws, "bad", "--json", "--root", str(root))
    assert bad.exit_code == 2
    assert json.loads(bad.output)["errors"][0].startswith(f"{ws.config_dir / 'bad.toml'}: sockets:")
    assert run(ws, "good", "--root", str(root)).exit_code == 0


def test_unknown_name_exits_2(ws: PlanWorkspace) -> None:
    result = CliRunner().invoke(
        main, ["plan", "nope"], env={"EPYCD_CONFIG_DIR": str(ws.config_dir)}
    )
    assert result.exit_code == 2 and "no endpoint file nope.toml" in result.output


@pytest.mark.vllm
def test_this_machine_with_the_real_vllm_venv(ws: PlanWorkspace, tmp_path: Path) -> None:
    """This machine (its own topology; under an EPYC identity where it is not an EPYC) with
    the real vLLM venv, probed for real: the host path, and the backend and consent that the
    machine's CPU and vLLM's platform call for (tests/machine.py)."""
    vllm, model = vllm_executable(), tiny_model()
    expected = serving(tmp_path)
    ws.endpoint("tiny", f'model = "{model}"\nvllm = "{vllm}"\nruntime = "host"\n'
                "max_model_len = 512\n")  # fmt: skip
    result = run(ws, "tiny", "--json", "--root", str(expected.root))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["runtime"], data["backend"]) == ("host", expected.backend)
    assert data["requires_confirmation"] == expected.needs_consent, data["confirmation_reasons"]
    assert data["vllm_executable"] == str(vllm)
    assert data["socket"] == 0 and data["memory"]["fits"]
    assert expand(data["cpus"]) == physical_cpus_of_socket(0)
    pinned = sorted(physical_cpus_of_socket(0))
    front = 0 if len(pinned) == 1 else 2 if len(pinned) >= 64 else 1  # docs/tuning.md rule 1
    assert expand(data["omp_cpus"]) == pinned[: len(pinned) - front]
    assert data["env"]["VLLM_CPU_OMP_THREADS_BIND"] == data["omp_cpus"]
    assert "--kv-cache-memory-bytes" in data["vllm_args"], "vLLM 0.32 takes the pool in bytes"
    assert list(data["units"]) == ["epyc-llm-tiny.service"]


@pytest.mark.usefixtures("podman_5")
def test_json_has_the_listen_address_and_the_consent_it_needs(
    ws: PlanWorkspace, tmp_path: Path
) -> None:
    root = make_host(tmp_path / "hosts", "genoa-9654-2s-nps1")
    ws.endpoint("local")
    ws.endpoint("open", 'host = "0.0.0.0"\n')
    local = json.loads(run(ws, "local", "--json", "--root", str(root)).output)
    assert local["host"] == "127.0.0.1" and local["api_key_file"] is None
    assert not local["requires_confirmation"]
    result = run(ws, "open", "--root", str(root))
    assert result.exit_code == 0, result.output
    assert "0.0.0.0" in result.output and "no API key" in result.output
    assert "--accept-unvalidated" in result.output
    exposed = json.loads(run(ws, "open", "--json", "--root", str(root)).output)
    assert exposed["host"] == "0.0.0.0" and exposed["requires_confirmation"]
