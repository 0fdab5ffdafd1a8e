"""The published Gemma 3 270M (Q4_K_M GGUF from PyPI, tests/tools/published_gemma.sh), an
architecture (gemma3) the measured formulas do not cover, planned from llama-server's own
pass at the plan's words and served for real: `epycctl plan` of a llama.cpp endpoint with this
machine's llama-server, its unit's ExecStart= run as systemd would (the supervisor, the plan's
gate, a test-made NOTIFY_SOCKET) to READY=1; at temperature 0 it answers "Q: What is the
capital of France?\nA:" with Paris (to "The capital of France is" this small model says " the
capital of the country of France."); the server's PSS after a request within the plan's
process figure."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from click.testing import CliRunner

from epycd.cli import main
from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import UnmeasuredModel, llama_memory
from epycd.status.handoff import base_url
from tests.health.notifysock import NotifySocket
from tests.health.supervising import exec_start, start_supervisor
from tests.llama.planned import planned_with_real_llama
from tests.llama.realllama import llama_server, published_gemma
from tests.llama.test_real_llama_server import pss_bytes
from tests.machine import real_cpu

pytestmark = pytest.mark.llama

LOAD_BOUND_S = 120
CONTEXT = 4096
SLOTS = 2
QUESTION = "Q: What is the capital of France?\nA:"


GEMMA3_TEMPLATE = Path(__file__).parent / "templates" / "gemma3.jinja"
"""Gemma 3's own chat template (its source: tests/llama/templates/README.md)."""


def planned(tmp_path: Path, keys: str = "") -> dict[str, Any]:
    keys = f"max_model_len = {CONTEXT}\nmax_num_seqs = {SLOTS}\n{keys}"
    return planned_with_real_llama(tmp_path, "gemma", published_gemma(), keys)


@contextmanager
def serving(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]], data: dict[str, Any]
) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """The planned unit's ExecStart= under the supervisor, to READY=1: its URL (with /v1),
    its served name and the supervisor."""
    argv = exec_start(data["units"]["epyc-llm-gemma.service"])
    served, url = data["served_model_name"], base_url(int(argv[argv.index("--port") + 1]))
    log = tmp_path / "supervisor.log"
    with NotifySocket(tmp_path / "notify") as sock:
        supervisor = start_supervisor(argv, {"NOTIFY_SOCKET": str(sock.path)}, log)
        reap.append(supervisor)
        ready = sock.wait_for("READY=1", LOAD_BOUND_S)
        assert ready is not None, log.read_text()[-4000:]
        yield url, served, supervisor


def test_the_formulas_do_not_cover_gemma3() -> None:
    """What makes this model the case: without llama.cpp's own pass it is refused."""
    with pytest.raises(UnmeasuredModel, match="not gemma3"):
        llama_memory(
            read_gguf(published_gemma()), context=CONTEXT, slots=SLOTS,
            cpu_flags=real_cpu().flags, shared_pool=True,
        )  # fmt: skip


def llama_server_child(supervisor: subprocess.Popen[bytes]) -> psutil.Process:
    [server] = [
        child for child in psutil.Process(supervisor.pid).children(recursive=True)
        if Path(child.exe()).name == "llama-server"
    ]  # fmt: skip
    return server


def test_the_published_gemma_plans_serves_paris_within_its_fit(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    data = planned(tmp_path)
    memory = data["memory"]["memory"]
    vocab = read_gguf(published_gemma()).vocab_size
    assert vocab and memory["kv_bytes"] > 0
    # the server's own compute (one output per slot), not fit-params' ubatch of logits
    assert 0 < memory["compute_bytes"] < vocab * memory["ubatch"] * 4
    argv = exec_start(data["units"]["epyc-llm-gemma.service"])
    assert argv[argv.index("--ctx-size") + 1] == str(CONTEXT)
    with serving(tmp_path, reap, data) as (url, served, supervisor):
        answer = httpx.post(
            f"{url}/completions",
            json={"model": served, "prompt": QUESTION, "max_tokens": 8,
                  "temperature": 0},
            timeout=60,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        text = answer.json()["choices"][0]["text"]
        assert "Paris" in text, text
        pss = pss_bytes(llama_server_child(supervisor).pid)
    planned_bytes = data["memory"]["process_gb"] * 1024**3
    terms = ("weights", "repacked", "kv", "compute", "output", "server")
    said = ", ".join(f"{term} {memory[f'{term}_bytes'] / 2**20:.1f}" for term in terms)
    total = sum(memory[f"{term}_bytes"] for term in terms) / 2**20
    print(f"\ngemma: planned {total:.1f} MiB ({said}); PSS {pss / 2**20:.1f} MiB")
    assert pss <= planned_bytes, (pss, memory)


def test_estimate_asks_the_runtimes_llama_server_for_gemma(monkeypatch: pytest.MonkeyPatch) -> None:
    """`epycctl estimate` of the Gemma with the llama.cpp runtime built: its llama-server's own
    pass sizes it (4 slots of the trained context each, one unified pool)."""
    monkeypatch.setenv("EPYCD_LLAMA_RUNTIME_DIR", str(llama_server().parent.parent))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    done = CliRunner().invoke(
        main, ["estimate", str(published_gemma()), "--socket-gb", "64", "--max-model-len",
               "2048", "--json"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    memory = data["memory"]
    assert data["fits"] is True and memory["cells"] == 2048 * memory["slots"]
    vocab = read_gguf(published_gemma()).vocab_size
    assert vocab and 0 < memory["compute_bytes"] < vocab * memory["ubatch"] * 4
    assert memory["kv_bytes"] > 0


CHAT = [
    {"role": "user", "content": "What is the capital of Germany?"},
    {"role": "assistant", "content": "Berlin."},
    {"role": "user", "content": "What is the capital of France?"},
]
"""A question after one answered the same way: the published model is Gemma 3's pretrained
one, which follows a turn's pattern but was not tuned to answer a lone question."""


def test_gemma_chats_with_the_template_its_endpoint_file_gives(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    """The file has no chat template (check-model: completions only); `chat_template =` with
    Gemma 3's own gives the endpoint a chat, in Gemma's turns, that answers the question."""
    data = planned(tmp_path, f'chat_template = "{GEMMA3_TEMPLATE}"\n')
    argv = exec_start(data["units"]["epyc-llm-gemma.service"])
    assert argv[argv.index("--chat-template-file") + 1] == str(GEMMA3_TEMPLATE.resolve())
    with serving(tmp_path, reap, data) as (url, served, _):
        answer = httpx.post(
            f"{url}/chat/completions",
            json={"model": served, "messages": CHAT, "max_tokens": 8, "temperature": 0},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        reply = answer.json()["choices"][0]["message"]["content"]
        assert "Paris" in reply, reply
