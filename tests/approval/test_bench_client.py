"""`epycctl bench NAME` calls the endpoint as its own clients do: at its own address
(`host = "127.0.0.2"`, `"::1"`) and, for a keyed endpoint, with its API key, which reaches
vLLM's bench client through OPENAI_API_KEY in its environment only (never its argv, a log
or the kept result). Only root or the admin group may run it, offline or not: a non-root
run is refused before anything runs, as `approve` refuses.

The endpoint is a real HTTP server on that address that answers 401 without the key; its
`vllm` is a stand-in that records its argv and environment, then does what the real bench
client does first: GET /v1/models at --base-url with `Authorization: Bearer
$OPENAI_API_KEY` (the real benchmark needs a real vLLM, left to benchmarks/ and the
lead's runs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.approval.conftest import ApprovalSandbox, make_env
from tests.approval.plans import make_plan
from tests.approval.test_bench import approve_host_endpoint
from tests.render.fixtures import as_plan, genoa_podman

KEY = "s3cr3t-bench-k3y"
NOBODY = 65534

FAKE_VLLM = """#!{python}
import json, os, sys, urllib.request
args = sys.argv[1:]
with open({calls!r}, "a") as log:
    log.write(json.dumps({{"argv": args, "key": os.environ.get("OPENAI_API_KEY")}}) + "\\n")
value = lambda flag: args[args.index(flag) + 1]
if args[1] == "throughput":
    with open(value("--output-json"), "w") as out:
        json.dump({{"elapsed_time": 4.0, "num_requests": int(value("--num-prompts"))}}, out)
    sys.exit(0)
if "--base-url" in args:
    base = value("--base-url")
else:  # vLLM's default: http://{{--host}}:{{--port}}
    base = "http://" + value("--host") + ":" + value("--port")
request = urllib.request.Request(base + "/v1/models")
if os.environ.get("OPENAI_API_KEY"):
    request.add_header("Authorization", "Bearer " + os.environ["OPENAI_API_KEY"])
urllib.request.urlopen(request, timeout=10)  # HTTPError 401 without the right key
result = {{"completed": 8, "duration": 2.0, "output_throughput": 100.0, "mean_ttft_ms": 50.0,
          "mean_tpot_ms": 10.0}}
with open(os.path.join(value("--result-dir"), value("--result-filename")), "w") as out:
    json.dump(result, out)
"""


def handler(key: str | None) -> type[BaseHTTPRequestHandler]:
    class Endpoint(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            keyed = self.path.startswith("/v1/") and key is not None
            if keyed and self.headers.get("Authorization") != f"Bearer {key}":
                self.send_response(401)
            else:
                self.send_response(200 if self.path in {"/health", "/v1/models"} else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    return Endpoint


def free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(address: str, key: str | None = None) -> int:
        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

        server = Server((address, 0), handler(key))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def key_file() -> Iterator[Path]:
    """The endpoint's key in a root-only file, in a folder only root can write (not under
    /tmp, which everyone may write: a key there is refused)."""
    folder = Path(tempfile.mkdtemp(prefix="epycd-bench-key-", dir="/run"))
    try:
        path = folder / "chat.key"
        path.write_text(KEY + "\n")
        path.chmod(0o600)
        yield path
    finally:
        shutil.rmtree(folder)


def approve(env: ApprovalSandbox, port: int, **update: object) -> Path:
    """test_bench's endpoint with this module's stand-in, under its own served name."""
    default = make_plan("chat", env.host(), env.settings.config_dir, port=port)
    served = update.pop("served_model_name", default.decisions.served_model_name)
    return approve_host_endpoint(env, port, FAKE_VLLM, served_model_name=served, **update)


def recorded(calls: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_a_keyed_endpoint_gets_its_key_through_the_environment_only(
    env: ApprovalSandbox, serve: Any, key_file: Path
) -> None:
    port = serve("127.0.0.1", KEY)
    calls = approve(env, port, api_key_file=str(key_file))
    done = env.epycctl("bench", "chat", "--concurrency", "1", "--json", OPENAI_API_KEY="other")
    assert done.returncode == 0, done.stdout + done.stderr
    [call] = recorded(calls)
    assert call["key"] == KEY
    assert not any(KEY in arg for arg in call["argv"])
    assert call["argv"][call["argv"].index("--base-url") + 1] == f"http://127.0.0.1:{port}"
    assert json.loads(done.stdout)["runs"][0]["output_throughput"] == 100.0
    kept = (env.settings.state_dir / "bench" / "chat.json").read_text()
    assert KEY not in done.stdout + done.stderr + kept


def test_an_endpoint_without_a_key_gets_no_callers_openai_key(
    env: ApprovalSandbox, serve: Any
) -> None:
    calls = approve(env, serve("127.0.0.1"))
    done = env.epycctl("bench", "chat", "--concurrency", "1", OPENAI_API_KEY="sk-for-openai")
    assert done.returncode == 0, done.stderr
    assert [call["key"] for call in recorded(calls)] == [None]


@pytest.mark.parametrize(("host", "url_host"), [("127.0.0.2", "127.0.0.2"), ("::1", "[::1]")])
def test_the_endpoint_is_called_at_its_own_address(
    env: ApprovalSandbox, serve: Any, host: str, url_host: str
) -> None:
    port = serve(host)
    calls = approve(env, port, host=host)
    done = env.epycctl("bench", "chat", "--concurrency", "1", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    [call] = recorded(calls)
    argv = call["argv"]
    assert argv[argv.index("--base-url") + 1] == f"http://{url_host}:{port}"
    assert "--host" not in argv and "127.0.0.1" not in " ".join(argv)


def test_a_container_endpoint_passes_the_key_by_name(tmp_path: Path) -> None:
    from epycd.cli.bench import bench_env
    from epycd.engines.vllm.cli.bench import bench_argv, serve_bench_args

    plan = as_plan(
        genoa_podman(), image="docker.io/amdih/zendnn_zentorch:test", port=8001, host="::1",
        served_model_name="qwen", model="Qwen/Qwen3-0.6B", api_key_file="/etc/epyc-llm/k",
    )  # fmt: skip
    argv = bench_argv(plan, serve_bench_args(plan, 4, 16, (8, 8), "/epycd-bench/c4.json"), tmp_path)
    assert "--env=OPENAI_API_KEY" in argv and argv.index("--env=OPENAI_API_KEY") < argv.index(
        str(plan.decisions.image)
    )
    assert argv[argv.index("--base-url") + 1] == "http://[::1]:8001"
    assert bench_env(KEY)["OPENAI_API_KEY"] == KEY
    assert "OPENAI_API_KEY" not in bench_env(None)


@pytest.fixture
def open_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    """Folders another user can reach (pytest's own tmp folder is root-only)."""
    base = Path(tempfile.mkdtemp(prefix="epycd-bench-"))
    base.chmod(0o755)
    try:
        yield make_env(base, monkeypatch)
    finally:
        shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
@pytest.mark.parametrize("mode", [["--offline"], ["--concurrency", "1"]])
def test_non_root_is_refused_before_anything_runs(
    open_env: ApprovalSandbox, serve: Any, mode: list[str]
) -> None:
    env = open_env
    port = serve("127.0.0.1") if "--offline" not in mode else free_port("127.0.0.1")
    calls = approve(env, port)
    done = env.epycctl("bench", "chat", *mode, user=NOBODY)
    action = "bench --offline" if "--offline" in mode else "bench"
    assert done.returncode == 1, done.stderr
    assert f"{action} needs root; you are nobody (uid {NOBODY})" in done.stderr
    assert "Traceback" not in done.stderr
    assert not calls.exists()
    assert not (env.settings.state_dir / "bench" / "chat.json").exists()
