"""`epycctl bench NAME` through the real CLI: the endpoint's own `vllm bench serve` is run
per concurrency, the results are shown and kept in the state folder; an endpoint that does
not answer /health is a "no" (exit 1), an unapproved one bad input (exit 2).

The endpoint is a real HTTP server answering /health; its vLLM is a stub that writes the
result file `vllm bench serve --save-result` writes (the real benchmark starts a real vLLM:
minutes of CPU, left to benchmarks/serving.py and the lead's runs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from epycd.plan.model import HfCacheMount
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.render.fixtures import as_plan, genoa_podman, with_decisions

FAKE_VLLM = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open({calls!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
value = lambda flag: args[args.index(flag) + 1]
if args[1] == "throughput":
    with open(value("--output-json"), "w") as out:
        json.dump({{"elapsed_time": 4.0, "num_requests": int(value("--num-prompts")),
                   "total_num_tokens": 0, "requests_per_second": 0, "tokens_per_second": 0}}, out)
    sys.exit(0)
concurrency = int(value("--max-concurrency"))
result = {{"completed": int(value("--num-prompts")), "duration": 2.0,
          "output_throughput": 100.0 * concurrency, "mean_ttft_ms": 50.0 + concurrency,
          "mean_tpot_ms": 10.0}}
with open(os.path.join(value("--result-dir"), value("--result-filename")), "w") as out:
    json.dump(result, out)
"""


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def endpoint_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def approve_host_endpoint(
    env: ApprovalSandbox, port: int, fake_vllm: str = FAKE_VLLM, **update: object
) -> Path:
    """Approve a host endpoint `chat` whose vllm is `fake_vllm` (a stand-in that records its
    calls in the returned file); `update` changes the plan's fields."""
    vllm = env.tmp / "venv" / "bin" / "vllm"
    vllm.parent.mkdir(parents=True)
    calls = env.tmp / "bench-calls.jsonl"
    vllm.write_text(fake_vllm.format(python=sys.executable, calls=str(calls)))
    vllm.chmod(0o755)
    plan = make_plan("chat", env.host(), env.settings.config_dir, port=port)
    update = {"vllm_executable": str(vllm), "served_model_name": "tiny", **update}
    plan = with_decisions(plan, **update)
    env.set_plans(plan)
    done = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stderr
    return calls


def test_bench_runs_the_endpoints_vllm_per_concurrency_and_keeps_the_result(
    env: ApprovalSandbox, endpoint_port: int
) -> None:
    calls = approve_host_endpoint(env, endpoint_port)
    done = env.epycctl(
        "bench", "chat", "--concurrency", "1", "--concurrency", "8", "--input-len", "32", "--json"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [run["concurrency"] for run in data["runs"]] == [1, 8]
    assert [run["output_throughput"] for run in data["runs"]] == [100.0, 800.0]
    assert [run["num_prompts"] for run in data["runs"]] == [8, 32]
    assert "concurrency 8: done" in done.stderr
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    for argv in argvs:
        assert argv[:2] == ["bench", "serve"]
        assert argv[argv.index("--base-url") + 1] == f"http://127.0.0.1:{endpoint_port}"
        assert argv[argv.index("--model") + 1] == "tiny"
        assert argv[argv.index("--random-input-len") + 1] == "32"
        assert "--ignore-eos" in argv and argv[argv.index("--dataset-name") + 1] == "random"
    kept = json.loads((env.settings.state_dir / "bench" / "chat.json").read_text())
    assert kept["runs"] == data["runs"]
    status = env.epycctl("status", "chat", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["last_bench"]["runs"] == data["runs"]
    shown = env.epycctl("status", "chat")
    assert "last bench" in shown.stdout and "800.0" in shown.stdout


def test_bench_of_an_endpoint_that_is_not_ready_is_a_no(env: ApprovalSandbox) -> None:
    approve_host_endpoint(env, closed_port())
    done = env.epycctl("bench", "chat", "--concurrency", "1")
    assert done.returncode == 1
    assert "chat is not ready" in done.stderr and "epycctl start chat" in done.stderr
    assert not (env.settings.state_dir / "bench" / "chat.json").exists()


def test_bench_of_an_unapproved_endpoint_is_bad_input(env: ApprovalSandbox) -> None:
    done = env.epycctl("bench", "nope")
    assert done.returncode == 2
    assert "nope is not approved" in done.stderr and "Traceback" not in done.stderr


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl pins the offline run")
def test_offline_runs_bench_throughput_with_the_endpoints_sizing_and_pin(
    env: ApprovalSandbox,
) -> None:
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    args = ["/srv/models/tiny", "--dtype", "bfloat16", "--max-model-len", "512",
            "--max-num-seqs", "4", "--max-num-batched-tokens", "2048",
            "--kv-cache-memory-bytes", str(2**30), "--port", "8000"]  # fmt: skip
    calls = approve_host_endpoint(
        env, closed_port(), cpus=cpus, numa_nodes=[0], recorded_vllm_args=args, max_num_seqs=4
    )
    done = env.epycctl("bench", "chat", "--offline", "--output-len", "64", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["mode"] == "offline"
    [run] = data["runs"]
    assert run["num_prompts"] == 16 and run["output_throughput"] == 16 * 64 / 4.0
    [argv] = [json.loads(line) for line in calls.read_text().splitlines()]
    assert argv[:2] == ["bench", "throughput"]
    for flag, value in [
        ("--model", "/srv/models/tiny"),
        ("--max-num-seqs", "4"),
        ("--kv-cache-memory-bytes", str(2**30)),
        ("--output-len", "64"),
    ]:
        assert argv[argv.index(flag) + 1] == value, flag  # fmt: skip
    assert "--port" not in argv


def test_offline_refuses_while_the_endpoint_runs(env: ApprovalSandbox, endpoint_port: int) -> None:
    approve_host_endpoint(env, endpoint_port)
    done = env.epycctl("bench", "chat", "--offline")
    assert done.returncode == 1 and "epycctl stop chat" in done.stderr


def test_a_container_endpoint_is_measured_by_the_vllm_in_its_image(tmp_path: Path) -> None:
    from epycd.engines.vllm.cli.bench import bench_argv, serve_bench_args, throughput_argv

    plan = as_plan(
        genoa_podman(), image="docker.io/amdih/zendnn_zentorch:test", port=8001,
        served_model_name="qwen", model="Qwen/Qwen3-0.6B", cpus="98-191",
        numa_nodes=[4, 5], env={"VLLM_CPU_OMP_THREADS_BIND": "99-191"},
        recorded_vllm_args=["Qwen/Qwen3-0.6B", "--max-num-seqs", "8"], max_num_seqs=8,
        hf_cache=HfCacheMount(host_path="/srv/hf"), extra_mounts=[],
    )  # fmt: skip
    args = serve_bench_args(plan, 4, 16, (128, 128), "/epycd-bench/c4.json")
    argv = bench_argv(plan, args, tmp_path)
    assert argv[:6] == ["podman", "run", "--rm", "--network=host", "--entrypoint", "vllm"]
    assert f"{tmp_path}:/epycd-bench" in argv and "/srv/hf:/root/.cache/huggingface" in argv
    assert argv[argv.index(str(plan.decisions.image)) + 1 :][:2] == ["bench", "serve"]
    offline = throughput_argv(plan, 16, (128, 128), tmp_path)
    assert "--cpuset-cpus=98-191" in offline and "--cpuset-mems=4,5" in offline
    assert "--env=VLLM_CPU_OMP_THREADS_BIND=99-191" in offline
    assert offline.index("--cpuset-cpus=98-191") < offline.index(str(plan.decisions.image))
    assert offline[offline.index("--output-json") + 1] == "/epycd-bench/offline.json"
