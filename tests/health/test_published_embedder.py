"""A published embedder, served for real on both engines: sentence-transformers/all-MiniLM-L6-v2
(its real weights and tokenizer, tests/tools/published_embedder.sh).

- llama.cpp: the product's own `convert` (as approve and `epycctl convert` run it) writes its
  q8_0 GGUF with no patch: the converter knows its tokenizer, as it knows every published
  BERT-family embedder's;
- each engine's plan (`epycctl plan` with this machine's llama-server, or the real vLLM venv)
  is run as systemd runs its unit (the supervisor with the plan's gate, a test-made
  NOTIFY_SOCKET): READY=1 once the gate's embeddings request passed;
- its vectors are the model's own: against the model card's recipe (transformers' hidden
  states, mean pooling over the tokens, L2 norm) a cosine of at least 0.99 for every
  sentence, so an index built on one engine is searched on the other; and they carry meaning:
  two sentences about eating are closer than one about eating and one about riding.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import httpx
import pytest

from epycd.engines.llama_cpp.model.convert import CONVERTER_DIR, convert
from epycd.engines.llama_cpp.model.gguf import read_gguf
from epycd.status.handoff import base_url
from tests.health.notifysock import NotifySocket
from tests.health.pooling_models import published_embedder
from tests.health.realvllm import VENV, free_port, vllm_env, vllm_executable
from tests.health.supervising import exec_start, start_supervisor
from tests.llama.realllama import SERVER, llama_server
from tests.machine import serving
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_cli_plan import run

LOAD_BOUND_S = 300
WIDTH = 384
"""all-MiniLM-L6-v2's hidden size: its vectors' width."""
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "This framework generates embeddings for each input sentence",
]
MODEL_CARD_RECIPE = """
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
folder, sentences = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder).eval()
batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    hidden = model(**batch).last_hidden_state
mask = batch["attention_mask"].unsqueeze(-1).float()
mean = (hidden * mask).sum(1) / mask.sum(1)
print(json.dumps(torch.nn.functional.normalize(mean, dim=1).tolist()))
"""
"""The model card's way to embed with transformers alone, run by the vLLM venv's Python."""


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def reference_vectors(folder: Path) -> list[list[float]]:
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", MODEL_CARD_RECIPE, str(folder), json.dumps(SENTENCES)],
        capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    vectors: list[list[float]] = json.loads(done.stdout)
    return vectors


def served_vectors(url: str, served: str) -> list[list[float]]:
    answer = httpx.post(f"{url}/embeddings", json={"model": served, "input": SENTENCES},
                        timeout=60)  # fmt: skip
    assert answer.status_code == 200, answer.text
    data = sorted(answer.json()["data"], key=lambda item: item["index"])
    return [item["embedding"] for item in data]


def assert_the_models_own(vectors: list[list[float]], folder: Path) -> None:
    assert [len(vector) for vector in vectors] == [WIDTH] * len(SENTENCES)
    reference = reference_vectors(folder)
    agreement = [cosine(mine, theirs) for mine, theirs in zip(vectors, reference, strict=True)]
    assert min(agreement) >= 0.99, agreement
    eating, bread, riding = vectors[:3]
    assert cosine(eating, bread) > cosine(eating, riding) + 0.1, "the vectors carry meaning"


def serve_the_plan(
    tmp_path: Path,
    endpoint: str,
    reap: list[subprocess.Popen[bytes]],
    env: dict[str, str] | None = None,
) -> tuple[str, str]:
    """`epycctl plan` of the endpoint file `endpoint` (its port added), then its unit's
    ExecStart= under the supervisor until READY=1: the endpoint's base URL and served name."""
    (tmp_path / "ws").mkdir()
    ws = PlanWorkspace(tmp_path / "ws")
    port = free_port()
    ws.endpoint("minilm", f"{endpoint}port = {port}\n")
    planned = run(ws, "minilm", "--json", "--root", str(serving(tmp_path).root))
    assert planned.exit_code == 0, planned.output
    data = json.loads(planned.output)
    assert data["primary_endpoint"] == "embeddings"
    argv = exec_start(data["units"]["epyc-llm-minilm.service"])
    assert argv[argv.index("--embedding-width") + 1] == str(WIDTH)
    log = tmp_path / "supervisor.log"
    with NotifySocket(tmp_path / "notify") as sock:
        unit_env = (env or {}) | data.get("env", {}) | {"NOTIFY_SOCKET": str(sock.path)}
        reap.append(start_supervisor(argv, unit_env, log))
        ready = sock.wait_for("READY=1", LOAD_BOUND_S)
        assert ready is not None, log.read_text()[-4000:]
    return base_url(port), data["served_model_name"]


@pytest.mark.llama
def test_llama_cpp_serves_the_product_s_own_conversion_with_the_model_s_vectors(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    runtime = tmp_path / "llama-runtime"
    runtime.mkdir()
    (runtime / "bin").symlink_to(llama_server().parent)
    (runtime / CONVERTER_DIR).symlink_to(SERVER / CONVERTER_DIR)
    folder, gguf = published_embedder(), tmp_path / "all-MiniLM-L6-v2-q8_0.gguf"
    done = convert(str(folder), runtime_dir=runtime, python=str(VENV / "bin" / "python"),
                   output=gguf)  # fmt: skip
    assert (done.architecture, done.quantize) == ("BertModel", "q8_0")
    facts = read_gguf(gguf)
    assert (facts.architecture, facts.file_type, facts.pooling_type) == ("bert", "Q8_0", "mean")

    endpoint = f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\nmodel = "{gguf}"\n'
    url, served = serve_the_plan(tmp_path, endpoint, reap)
    assert_the_models_own(served_vectors(url, served), folder)


@pytest.mark.vllm
@pytest.mark.serves
def test_vllm_serves_the_published_folder_with_the_model_s_vectors(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    folder = published_embedder()
    endpoint = f'model = "{folder}"\nvllm = "{vllm_executable()}"\nruntime = "host"\n'
    url, served = serve_the_plan(tmp_path, endpoint, reap, vllm_env(tmp_path / "work"))
    assert_the_models_own(served_vectors(url, served), folder)
