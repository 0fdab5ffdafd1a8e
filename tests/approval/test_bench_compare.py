"""`epycctl bench NAME --compare`: after the endpoint's own runs, the same load on each
engine's plain defaults. Through the real CLI on a real llama.cpp endpoint (the tiny GGUF
served by this machine's llama-server, with an API key): plain `llama-server -m GGUF` of the
same binary and file is started, measured and stopped, vLLM is skipped with its reason (it
does not serve a GGUF file), the endpoint keeps serving. The argv builders of each engine
(`PLAIN` in its cli) on plans of each kind, and the runner's stop of a child that never
answers or ignores SIGTERM, without the CLI."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epycd.cli.bench import BenchResult, bench_table
from epycd.cli.bench_compare import (
    Load,
    PlainCommand,
    free_port,
    pinned_cpus,
    plain_makers,
    planned_with,
    run_alternative,
)
from epycd.engines.llama_cpp.cli import LlamaPlain
from epycd.engines.llama_cpp.plan.converted import converted_path
from epycd.engines.llama_cpp.plan.model import LlamaServer
from epycd.engines.vllm.cli import VllmPlain
from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.host.facts import RuntimeFacts
from epycd.plan.endpoint import Plan
from epycd.plan.model import ConvertedWeights, EngineChoice, HfCacheMount
from epycd.settings import Settings, settings_model
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.approval.test_bench_llama import KEY, approve_llama
from tests.llama.realllama import healthy, llama_server, serving, tiny_bert_gguf, tiny_gguf
from tests.plan.conftest import PlanWorkspace, fake_host
from tests.plan.test_auto_engine import AutoWorkspace
from tests.render.fixtures import as_plan, genoa_podman, with_decisions
from tests.secrets import root_folder

PORT = 18123
LOAD = Load(concurrencies=(1,), prompts_per_concurrency=1, lengths=(8, 4))


@pytest.fixture
def served() -> Iterator[str]:
    with serving("-c", "1024", "-np", "2", key=KEY) as url:
        yield url


def command_lines() -> list[list[str]]:
    """Every process's argv on this machine (those readable here)."""
    lines = []
    for entry in Path("/proc").iterdir():
        try:
            raw = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if raw:
            lines.append(raw.rstrip(b"\0").decode(errors="replace").split("\0"))
    return lines


def test_compare_measures_plain_llama_server_skips_vllm_and_stops_its_child(
    env: ApprovalSandbox, served: str
) -> None:
    with root_folder() as folder:
        approve_llama(env, folder, int(served.rsplit(":", 1)[1]))
        done = env.epycctl(
            "bench", "tiny", "--compare", "--concurrency", "1", "--input-len", "16",
            "--output-len", "8", "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["runs"][0]["completed"] > 0
    plain, vllm_planned, vllm = data["alternatives"]
    server = env.plans["tiny"].decisions.first
    assert isinstance(server, LlamaServer)
    port = plain["argv"][-1]
    assert plain["argv"] == [
        str(llama_server()), "-m", server.invocation.model_path, "--host", "127.0.0.1",
        "--port", port,
    ]  # fmt: skip
    assert Path(server.invocation.model_path) == tiny_gguf().resolve()
    assert plain["skipped"] is None and plain["cpus"]
    [run] = plain["runs"]
    assert run["error"] is None and run["completed"] > 0 and run["output_throughput"] > 0
    assert run["concurrency"] == 1 and run["num_prompts"] == 8
    assert vllm_planned["label"] == "vLLM, planned" and vllm_planned["argv"] is None
    why = vllm_planned["skipped"]
    assert why.startswith('its file planned with engine = "vllm": ') and "tiny.toml" in why, why
    assert vllm["label"] == "vllm serve, plain defaults" and vllm["argv"] is None
    assert vllm["skipped"].startswith("vLLM does not serve this GGUF") and vllm["runs"] == []
    assert plain["argv"] not in command_lines(), "the plain llama-server is still running"
    assert not healthy(f"http://127.0.0.1:{port}")
    assert healthy(served), "the endpoint itself keeps running"
    assert "llama-server, plain defaults: stopped" in done.stderr
    assert KEY not in done.stdout + done.stderr
    kept = json.loads((env.settings.state_dir / "bench" / "tiny.json").read_text())
    assert kept["alternatives"] == data["alternatives"]
    shown = bench_table(BenchResult.model_validate(kept))
    assert shown.splitlines()[0].split()[:2] == ["Server", "Concurrency"]
    assert "\ntiny " in shown and "\nllama-server, plain defaults " in shown
    assert "vllm serve, plain defaults: skipped: vLLM does not serve this GGUF" in shown
    assert 'vLLM, planned: skipped: its file planned with engine = "vllm"' in shown


def test_compare_of_an_embeddings_endpoint_measures_plain_llama_server_embeddings(
    env: ApprovalSandbox,
) -> None:
    """The tiny BERT embedder's GGUF on a real llama-server: the plain one gets the one flag
    it needs to serve /v1/embeddings and is measured by the pooling client, as the endpoint
    is; vLLM planned and plain are skipped with their reasons."""
    embedder = tiny_bert_gguf("embedder")
    with serving("--embeddings", "-c", "512", key=KEY, model=embedder) as url, root_folder() as f:
        approve_llama(env, f, int(url.rsplit(":", 1)[1]), embedder, context=512)
        assert env.plans["tiny"].decisions.primary_endpoint == "embeddings"
        done = env.epycctl("bench", "tiny", "--compare", "--concurrency", "1",
                           "--input-len", "8", "--json")  # fmt: skip
        assert healthy(url), "the endpoint itself keeps running"
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["runs"][0]["request_throughput"] > 0
    plain, vllm_planned, vllm = data["alternatives"]
    assert plain["argv"][-1] == "--embeddings", (plain, env.plans["tiny"].decisions.model_kind)
    assert plain["skipped"] is None
    [run] = plain["runs"]
    assert run["error"] is None and run["completed"] == 8
    assert run["request_throughput"] > 0 and run["p50_latency_ms"] > 0
    assert run["output_throughput"] is None, "an embedder generates nothing"
    assert vllm_planned["skipped"] and vllm["skipped"]
    assert plain["argv"] not in command_lines()


def test_compare_with_offline_is_bad_input(env: ApprovalSandbox) -> None:
    done = env.epycctl("bench", "chat", "--compare", "--offline")
    assert done.returncode == 2
    assert "--compare" in done.stderr and "without --offline" in done.stderr


def llama_plan(folder: Path) -> Plan:
    """A llama.cpp endpoint planned by the real planner: the tiny GGUF, this llama-server."""
    ws = PlanWorkspace(folder)
    ws.endpoint(
        "tiny",
        f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\nmodel = "{tiny_gguf()}"\n'
        "max_model_len = 1024\n",
    )
    result = ws.plan(fake_host(folder, "vm-zen5-24g", RuntimeFacts()))["tiny"]
    assert result.plan is not None, [e.text for e in result.errors]
    return result.plan


def settings_for(tmp: Path) -> Settings:
    return settings_model().model_validate(
        {
            "runtime_dir": tmp / "runtime",
            "llama_runtime_dir": tmp / "llama-runtime",
            "llama_converted_dir": tmp / "converted",
        }
    )


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_plain_llama_server_is_the_endpoints_binary_and_file(tmp_path: Path) -> None:
    plan = llama_plan(tmp_path)
    command = LlamaPlain().own(plan, settings_for(tmp_path), PORT)
    server = plan.decisions.first
    assert isinstance(server, LlamaServer)
    assert command.argv == [server.llama_server, "-m", server.invocation.model_path,
                            "--host", "127.0.0.1", "--port", str(PORT)]  # fmt: skip
    assert command.port == PORT and command.skipped is None


def test_vllm_skips_a_gguf_only_model_and_serves_the_source_of_a_converted_one(
    tmp_path: Path,
) -> None:
    plan = llama_plan(tmp_path)
    settings = settings_for(tmp_path)
    skipped = VllmPlain().other(plan, settings, PORT)
    assert skipped.argv is None
    assert skipped.skipped == f"vLLM does not serve this GGUF ({plan.decisions.model})"
    converted = EngineChoice(
        asked="auto",
        reasons=["converted"],
        converted=ConvertedWeights(source="Qwen/Qwen3-0.6B", source_revision="abc123",
                                   quantize="q8_0", sha256="0" * 64,
                                   source_identity="hub:Qwen/Qwen3-0.6B@abc123",
                                   source_sha256="1" * 64),
    )  # fmt: skip
    plan = with_decisions(plan, engine_choice=converted)
    no_runtime = VllmPlain().other(plan, settings, PORT)
    assert no_runtime.skipped and "packaging/install.sh --runtime" in no_runtime.skipped
    vllm = executable(tmp_path / "runtime" / "bin" / "vllm")
    command = VllmPlain().other(plan, settings, PORT)
    assert command.argv == [str(vllm), "serve", "Qwen/Qwen3-0.6B", "--host", "127.0.0.1",
                            "--port", str(PORT), "--revision", "abc123"]  # fmt: skip


def test_plain_vllm_serve_is_the_host_endpoints_vllm_on_its_model(tmp_path: Path) -> None:
    host = fake_host(tmp_path, "vm-zen5-24g", RuntimeFacts())
    plan = make_plan("chat", host, tmp_path)
    plan = with_decisions(plan, hf_cache=HfCacheMount(host_path="/srv/hf"))
    command = VllmPlain().own(plan, settings_for(tmp_path), PORT)
    assert command.argv == ["/opt/vllm/bin/vllm", "serve", "/srv/models/tiny", "--host",
                            "127.0.0.1", "--port", str(PORT)]  # fmt: skip
    assert command.env == {"HF_HOME": "/srv/hf"} and command.start_bound_s >= 90


def test_plain_vllm_serve_skips_a_container_endpoint_with_the_reason(tmp_path: Path) -> None:
    plan = as_plan(genoa_podman(), image="docker.io/amdih/zendnn_zentorch:test")
    command = VllmPlain().own(plan, settings_for(tmp_path), PORT)
    assert command.argv is None
    assert command.skipped and "podman endpoint" in command.skipped
    assert "docker.io/amdih/zendnn_zentorch:test" in command.skipped


def test_llama_server_serves_the_converted_gguf_of_a_vllm_endpoint(tmp_path: Path) -> None:
    host = fake_host(tmp_path, "vm-zen5-24g", RuntimeFacts())
    plan = make_plan("chat", host, tmp_path)
    settings = settings_for(tmp_path)
    missing = LlamaPlain().other(plan, settings, PORT)
    assert missing.argv is None and missing.skipped
    assert "epycctl convert /srv/models/tiny --output" in missing.skipped
    gguf = converted_path(tmp_path / "converted", "/srv/models/tiny", None, "q4_k_m")
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")
    no_runtime = LlamaPlain().other(plan, settings, PORT)
    assert no_runtime.skipped and "not built" in no_runtime.skipped
    server = executable(tmp_path / "llama-runtime" / "bin" / "llama-server")
    (tmp_path / "llama-runtime" / ".epyc-stamp").write_text("built\n")
    command = LlamaPlain().other(plan, settings, PORT)
    assert command.argv == [str(server), "-m", str(gguf), "--host", "127.0.0.1",
                            "--port", str(PORT)]  # fmt: skip


def python_child(code: str, marker: str) -> list[str]:
    return [sys.executable, "-c", code, marker]


def test_a_child_that_never_answers_is_skipped_and_stopped(tmp_path: Path) -> None:
    argv = python_child("import time; time.sleep(120)", f"epycd-compare-{tmp_path.name}")
    command = PlainCommand(label="sleeper", port=free_port(), argv=argv, start_bound_s=1)
    cpu = min(os.sched_getaffinity(0))
    done = run_alternative(command, {cpu}, None, LOAD)
    assert done.skipped and done.skipped.startswith("/health did not answer 200 within 1 s")
    assert done.argv == argv and done.cpus == str(cpu) and done.runs == []
    assert argv not in command_lines()


def test_a_child_that_ignores_sigterm_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("epycd.cli.bench_compare.STOP_BOUND_S", 1.0)
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('loading', flush=True); time.sleep(120)"
    )
    argv = python_child(code, f"epycd-compare-{tmp_path.name}")
    command = PlainCommand(label="stubborn", port=free_port(), argv=argv, start_bound_s=1)
    done = run_alternative(command, os.sched_getaffinity(0), None, LOAD)
    assert done.skipped and done.skipped.endswith(": loading")
    assert argv not in command_lines()


def test_a_child_that_ends_is_skipped_with_its_exit_and_output(tmp_path: Path) -> None:
    argv = python_child("import sys; print('no model'); sys.exit(3)", "x")
    command = PlainCommand(label="ends", port=free_port(), argv=argv)
    done = run_alternative(command, os.sched_getaffinity(0), None, LOAD)
    assert done.skipped == "ended with exit 3 before it was ready: no model"


def test_the_child_is_pinned_and_gets_no_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the child sees: its affinity and whether any key variable reached it."""
    monkeypatch.setenv("LLAMA_API_KEY", "sk-never-passed")
    out = tmp_path / "seen.json"
    code = (
        "import json, os, sys; json.dump({'cpus': sorted(os.sched_getaffinity(0)), "
        "'keys': [k for k in os.environ if k.endswith('API_KEY')]}, open(sys.argv[1], 'w'))"
    )
    cpu = min(os.sched_getaffinity(0))
    command = PlainCommand(label="env", port=free_port(), argv=python_child(code, str(out)))
    run_alternative(command, {cpu}, None, LOAD)
    seen = json.loads(out.read_text())
    assert seen == {"cpus": [cpu], "keys": []}


def test_the_endpoints_engine_comes_first_then_the_other_planned_and_plain(
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path)
    host = fake_host(tmp_path, "vm-zen5-24g", RuntimeFacts())
    vllm_plan = make_plan("chat", host, tmp_path)
    makers = plain_makers(vllm_plan, host)
    labels = [make(vllm_plan, settings, PORT).label for make in makers]
    assert labels == ["vllm serve, plain defaults", "llama.cpp, planned",
                      "llama-server, plain defaults"]  # fmt: skip
    (tmp_path / "llama").mkdir()
    llama = llama_plan(tmp_path / "llama")
    labels = [make(llama, settings, PORT).label for make in plain_makers(llama, host)]
    assert labels == ["llama-server, plain defaults", "vLLM, planned", "vllm serve, plain defaults"]


def with_port(words: list[str], port: int) -> list[str]:
    """`words` listening on the loopback's `port`."""
    words = list(words)
    words[words.index("--port") + 1] = str(port)
    words[words.index("--host") + 1] = "127.0.0.1"
    return words


def test_the_other_engine_planned_waits_for_its_conversion_then_is_its_plans_server(
    tmp_path: Path,
) -> None:
    """A vLLM endpoint of `engine = "auto"` (throughput): its file planned with llama.cpp
    waits for the conversion, named with the command that makes it; once converted, it is
    the llama-server the plan would run, on the plan's CPUs; the same file planned with
    vLLM again is the vLLM the endpoint runs."""
    aw = AutoWorkspace(PlanWorkspace(tmp_path), fake_host(tmp_path, "genoa-9654-2s-nps1"))
    aw.ws.endpoint("batch", 'engine = "auto"\nprofile = "throughput"\n')
    plan = aw.plan()["batch"].plan
    assert plan is not None and plan.decisions.engine == "vllm"
    waiting = planned_with(plan, aw.ws.settings, "llama.cpp", aw.host)
    assert isinstance(waiting, str), waiting
    gguf = converted_path(aw.converted, str(aw.ws.model), None, "q8_0")
    assert waiting.startswith('its file planned with engine = "llama.cpp": ')
    assert f"epycctl convert {aw.ws.model} --quantize q8_0 --output {gguf}" in waiting
    aw.convert()
    swapped = planned_with(plan, aw.ws.settings, "llama.cpp", aw.host)
    assert isinstance(swapped, Plan), swapped
    assert swapped.decisions.engine == "llama.cpp" and swapped.endpoint == "batch"
    server = swapped.decisions.first
    assert isinstance(server, LlamaServer)
    command = LlamaPlain().planned(swapped, PORT)
    assert command.argv == [server.llama_server, *with_port(server.server_args, PORT)]
    assert command.cpus == server.cpus and command.port == PORT and command.skipped is None
    again = planned_with(plan, aw.ws.settings, "vllm", aw.host)
    assert isinstance(again, Plan) and again.decisions.engine == "vllm"
    assert again.decisions.first.cpus == plan.decisions.first.cpus


def test_vllm_planned_is_the_host_vllm_of_its_plan(tmp_path: Path) -> None:
    """The real planner's vLLM plan of a file: in podman it is skipped with the image; on the
    host it is the plan's `vllm serve` words, environment and CPUs on the given port."""
    aw = AutoWorkspace(PlanWorkspace(tmp_path), fake_host(tmp_path, "genoa-9654-2s-nps1"))
    aw.ws.endpoint("batch", 'engine = "vllm"\n')
    plan = aw.plan()["batch"].plan
    assert plan is not None and plan.decisions.runtime == "podman"
    podman = VllmPlain().planned(plan, PORT)
    assert podman.argv is None and podman.skipped and "podman's image" in podman.skipped
    plan = with_decisions(plan, runtime="host", vllm_executable="/opt/vllm/bin/vllm",
                          hf_cache=HfCacheMount(host_path="/srv/hf"))  # fmt: skip
    server = plan.decisions.first
    assert isinstance(server, VllmCpuServer)
    command = VllmPlain().planned(plan, PORT)
    assert command.argv == ["/opt/vllm/bin/vllm", "serve", *with_port(server.vllm_args, PORT)]
    assert "--max-num-seqs" in command.argv
    assert command.env == server.env | {"HF_HOME": "/srv/hf"}
    assert command.env["VLLM_CPU_OMP_THREADS_BIND"] == server.omp_cpus
    assert command.cpus == server.cpus and command.start_bound_s >= 90


def test_llama_server_planned_serves_and_is_measured(tmp_path: Path) -> None:
    """The planned llama-server of the tiny GGUF (its threads, slots, context, pinned to the
    plan's CPUs this machine has), started, measured by the endpoint's load and stopped."""
    plan = llama_plan(tmp_path)
    command = LlamaPlain().planned(plan, free_port())
    assert command.argv is not None and "--ctx-size" in command.argv
    cpus, problem = pinned_cpus(command.cpus or "")
    assert problem is None, problem
    done = run_alternative(command, cpus, None, LOAD)
    assert done.skipped is None, done.skipped
    [run] = done.runs
    assert run.error is None and run.completed and run.output_throughput
    assert command.argv not in command_lines()
