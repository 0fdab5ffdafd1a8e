"""The recipe's real llama-server (packaging/llama-runtime.sh, built for this CPU) serves the
tiny model's GGUF files, and what `check-model` reads from a file is what the engine itself
reports of it: its size, context, width, and the KV cache its attention figures give; and the
memory a llama.cpp endpoint's fit counts is what the server allocates."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.engines.llama_cpp.model.memory import llama_memory
from epycd.engines.llama_cpp.plan.fit import measured_memory_at
from epycd.model.check import inspect_model
from tests.health.realvllm import VllmServer, free_port
from tests.llama.realllama import llama_server, tiny_gguf
from tests.machine import real_cpu

pytestmark = pytest.mark.llama
HEALTHY_WITHIN_S = 60.0
CONTEXT = 1024
KV_LOG = re.compile(r"llama_kv_cache: size = +(?P<mib>[0-9.]+) MiB \( *(?P<cells>\d+) cells")


@pytest.fixture(params=["q8_0", "bf16"])
def served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, str, VllmServer]]:
    model = tiny_gguf(request.param)
    port = free_port()
    argv = [
        str(llama_server()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-a", "tiny", "-t", "1", "-c", str(CONTEXT), "-np", "1", "--no-ui",
        "-lv", "4",  # the library's own lines: the KV cache it allocated
    ]  # fmt: skip
    server = VllmServer(argv, tmp_path, env={"PATH": "/usr/bin:/bin"})
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(base, HEALTHY_WITHIN_S, poll_s=0.2)
        yield model, base, server
    finally:
        server.stop()


def test_it_serves_chat_and_completions(served: tuple[Path, str, VllmServer]) -> None:
    _, base, _ = served
    models = httpx.get(f"{base}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] > 0
    completion = httpx.post(
        f"{base}/v1/completions",
        json={"model": "tiny", "prompt": "def main", "max_tokens": 8},
        timeout=60,
    )
    assert completion.status_code == 200, completion.text


def test_check_model_reads_what_the_engine_loads(served: tuple[Path, str, VllmServer]) -> None:
    model, base, server = served
    facts = inspect_model(str(model))
    assert facts.gguf is not None
    meta = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["meta"]
    assert meta["size"] == facts.weights_bytes == facts.gguf.tensors_bytes
    assert meta["n_ctx_train"] == facts.max_position_embeddings
    assert meta["n_embd"] == facts.gguf.embedding_length
    kv = KV_LOG.search(server.log_text())
    assert kv is not None, server.log_text()[-3000:]
    cells = int(kv["cells"])
    assert cells == CONTEXT
    assert float(kv["mib"]) == pytest.approx(cells * facts.kv_bytes_per_token / 1024**2, abs=0.005)


BUFFER_LOG = re.compile(
    r"(?P<buffer>CPU(?:_REPACK|_Mapped)?)\s+(?P<kind>model|KV|compute|output) buffer size "
    r"=\s+(?P<mib>[0-9.]+) MiB"
)
MIB = 1024**2


def logged_buffers(log: str) -> dict[str, float]:
    return {f"{m['buffer']} {m['kind']}": float(m["mib"]) for m in BUFFER_LOG.finditer(log)}


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no Pss in /proc/{pid}/smaps_rollup")


@pytest.mark.parametrize("out_type", ["q8_0", "bf16", "q4_0"])
def test_the_memory_terms_are_the_servers(tmp_path: Path, out_type: str) -> None:
    """The fit's terms (epycd.engines.llama_cpp.model.memory) against what this machine's
    llama-server allocates for the tiny model: KV, output and repacked matrices exactly, the
    compute buffer and the whole process's PSS (after a request) within ours. q4_0 is quantized
    here by the runtime's own `llama quantize` (its matrices are the ones the CPU backend
    repacks). The plan's own figures, llama-server's pass at the same words, hold the same
    buffers to llama.cpp's MiB and the PSS within their total."""
    if out_type == "q4_0":
        model = tmp_path / "tiny-q4_0.gguf"
        quantize = [str(llama_server().with_name("llama")), "quantize", str(tiny_gguf("bf16"))]
        done = subprocess.run([*quantize, str(model), "Q4_0"], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    else:
        model = tiny_gguf(out_type)
    gguf = read_gguf(model)
    ours = llama_memory(gguf, context=512, slots=2, cpu_flags=real_cpu().flags, ubatch=256)
    port = free_port()
    argv = [
        str(llama_server()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-a", "tiny", "-t", "1", "-c", str(ours.cells), "-np", "2", "--kv-unified", "-ub", "256",
        "--cache-ram", "0", "--fit", "off", "--no-ui", "-lv", "4",
    ]  # fmt: skip
    server = VllmServer(argv, tmp_path, env={"PATH": "/usr/bin:/bin"})
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_healthy(base, HEALTHY_WITHIN_S, poll_s=0.2)
        chat = httpx.post(
            f"{base}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi " * 200}], "max_tokens": 16},
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        pss = pss_bytes(server.process.pid)
    finally:
        server.stop()
    logged = logged_buffers(server.log_text())
    assert "CPU compute" in logged, server.log_text()[-3000:]
    assert logged["CPU KV"] == round(ours.kv_bytes / MIB, 2)
    assert logged["CPU output"] == round(ours.output_bytes / MIB, 2)
    assert logged.get("CPU_REPACK model", 0.0) == round(ours.repacked_bytes / MIB, 2)
    assert (out_type == "q4_0") == (ours.repacked_bytes > 0) or "avx2" not in real_cpu().flags
    assert logged["CPU compute"] <= round(ours.compute_bytes / MIB, 2)
    assert logged["CPU_Mapped model"] <= round(ours.weights_bytes / MIB, 2)
    assert pss <= ours.total_bytes, (pss, ours)
    # the plan's own source: llama-server's pass at these very words, to its MiB, above PSS
    told = measured_memory_at(
        str(llama_server()), gguf, lambda cells: argv[1:], slots=2, ubatch=256,
        embeddings=False,
    )(ours.cells)  # fmt: skip
    assert told.source == "llama.cpp" and told.cells == ours.cells
    for term, buffer in (
        ("kv", "CPU KV"),
        ("compute", "CPU compute"),
        ("repacked", "CPU_REPACK model"),
    ):
        planned = getattr(told, f"{term}_bytes") / MIB
        assert logged.get(buffer, 0.0) <= planned <= logged.get(buffer, 0.0) + 1, (term, told)
    assert pss <= told.total_bytes, (pss, told)
