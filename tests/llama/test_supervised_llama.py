"""The planned llama.cpp endpoint's server under epycd's supervisor, as its unit runs it
(docs/tuning.md rule 10): the real llama-server of this machine with the words the planner
wrote, read through a test-made NOTIFY_SOCKET as systemd would. READY=1 once the gate (/health,
/v1/models, one chat) passed; the API key handed over as a systemd credential and given to
llama-server as LLAMA_API_KEY, never on its argv; the engine's progress read from its /metrics
(what the watchdog's stall check reads); WATCHDOG=1 while serving; SIGTERM forwarded."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from epycd.engines.llama_cpp.plan.model import LlamaInvocation, llama_server_argv
from epycd.health import read_progress
from epycd.supervisor import read_status
from tests.health.notifysock import NotifySocket
from tests.health.realvllm import free_port
from tests.health.supervising import session_members, start_supervisor, supervisor_argv
from tests.llama.realllama import llama_server, tiny_gguf
from tests.machine import physical_cpus

LOAD_BOUND_S = 60


def planned_words(port: int, threads: int) -> list[str]:
    invocation = LlamaInvocation(
        model_path=str(tiny_gguf("q8_0")),
        alias="tiny",
        host="127.0.0.1",
        port=port,
        threads=threads,
        slots=2,
        context=1024,
        ubatch=512,
        cache_ram_mib=64,
        load_mode="mmap+mlock",
    )
    return [str(llama_server()), *llama_server_argv(invocation)]


def test_the_planned_ngram_speculation_drafts_and_answers(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    """`speculative = "ngram"`'s words, run by the real llama-server: it starts, answers a
    request that repeats its prompt, and counts drafted tokens in its own /metrics."""
    port = free_port()
    invocation = LlamaInvocation(
        model_path=str(tiny_gguf("q8_0")), alias="tiny", host="127.0.0.1", port=port,
        threads=len(physical_cpus()), slots=1, context=1024, ubatch=512, cache_ram_mib=0,
        load_mode="mmap", speculative="ngram",
    )  # fmt: skip
    argv = [str(llama_server()), *llama_server_argv(invocation)]
    assert argv[-2:] == ["--spec-type", "ngram-mod"]
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    reap.append(server)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + LOAD_BOUND_S
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        time.sleep(0.2)
    assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
    prompt = " ".join(["def add(a, b): return a + b"] * 40)
    reply = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 64, "temperature": 0},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    drafted = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("llamacpp:spec_decode_num_draft_tokens_total")
    ]
    assert drafted and drafted[0] >= 0, metrics[-2000:]


def test_ready_key_progress_and_sigterm(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "api_key").write_text("llama-secret\n")
    status_file = tmp_path / "run" / "status.json"
    log = tmp_path / "supervisor.log"
    argv = supervisor_argv(
        url=url,
        model="tiny",
        status_file=status_file,
        server=planned_words(port, len(physical_cpus())),
        extra=("--api-key-credential", "api_key", "--api-key-env", "LLAMA_API_KEY"),
    )
    with NotifySocket(tmp_path / "notify") as sock:
        env = {key: value for key, value in os.environ.items() if "API_KEY" not in key}
        env |= {
            "NOTIFY_SOCKET": str(sock.path),
            "WATCHDOG_USEC": "2000000",
            "CREDENTIALS_DIRECTORY": str(credentials),
        }
        supervisor = start_supervisor(argv, env, log)
        reap.append(supervisor)
        ready = sock.wait_for("READY=1", LOAD_BOUND_S)
        assert ready is not None, log.read_text()[-4000:]
        assert f"STATUS=serving tiny on {url}" in ready.split("\n")
        status = read_status(status_file)
        assert status is not None and status.state == "ready" and status.pid is not None
        assert set(status.seconds) == {"health", "models", "request"}

        anonymous = httpx.get(f"{url}/v1/models", timeout=30)
        assert anonymous.status_code == 401, "llama-server took the key from LLAMA_API_KEY"
        key = {"Authorization": "Bearer llama-secret"}
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4},
            headers=key,
            timeout=30,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        with httpx.Client(base_url=url, headers=key) as client:
            progress = read_progress(client, 30)
        assert progress.running == 0, "nothing runs between requests"
        gate_and_chat = answer.json()["usage"]["total_tokens"]
        assert progress.tokens > gate_and_chat, "the gate's request and the chat are counted"
        server = psutil.Process(status.pid)
        assert "llama-secret" not in " ".join(server.cmdline())
        assert sock.wait_for("WATCHDOG=1", 3) is not None, "pings at half of WATCHDOG_USEC"

        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(60)
        assert sock.wait_for("STOPPING=1", 2) is not None
    assert code == 0 or code == -signal.SIGTERM or code == 128 + signal.SIGTERM, code
    assert not session_members(status.pid), "llama-server is gone"
    stopped = read_status(status_file)
    assert stopped is not None and stopped.state == "stopped"
    assert f"listening on {url}" in log.read_text(), "llama-server's output passes through"
