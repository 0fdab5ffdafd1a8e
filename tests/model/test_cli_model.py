"""`epycctl check-model` and `epycctl estimate`: exit codes, JSON keys, tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from epycd.cli import main
from epycd.engines import ENGINES
from epycd.engines.vllm.plan.tuning import kv_pool_gib
from epycd.host.detect import detect_host
from epycd.model.formats import InspectRequest, format_of, model_formats
from epycd.plan.tuning import headroom_gib
from tests.hosts import make_host
from tests.model.models import LLAMA_8B_TOTAL_SIZE

pytestmark = pytest.mark.usefixtures("offline_hub")

CHECK_KEYS = {
    "model", "architectures", "supported", "kind", "launchable", "primary_endpoint",
    "supported_endpoints", "chat_template", "gated", "message",
}  # fmt: skip
ESTIMATE_KEYS = {
    "weights_gb", "kv_bytes_per_token", "context", "kv_gb", "required_gb", "available_gb",
    "fits", "suggested_max_model_len", "action", "runtime_gb", "process_gb", "headroom_gb",
}  # fmt: skip


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def run_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = run(*args, "--json")
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize(
    ("model", "exit_code", "kind"),
    [
        ("Qwen/Qwen3-0.6B", 0, "text"),
        ("allenai/OLMo-2-0425-1B", 0, "text"),
        ("Qwen/Qwen2.5-VL-7B-Instruct", 0, "multimodal"),
        ("THUDM/glm-4-9b-chat-hf", 0, "text"),
        ("BAAI/bge-small-en-v1.5", 0, "embedding"),
        ("BAAI/bge-reranker-base", 0, "rerank"),
        ("cardiffnlp/twitter-roberta-base-sentiment-latest", 1, "classify"),
        ("google-t5/t5-small", 1, "unsupported"),
    ],
)
def test_check_model_exit_codes_and_json(model: str, exit_code: int, kind: str) -> None:
    code, data = run_json("check-model", model)
    assert code == exit_code
    assert set(data) >= CHECK_KEYS
    assert data["kind"] == kind
    assert data["supported"] is (kind != "unsupported")
    assert set(data["chat_template"]) >= {"status", "names"}


def test_every_engine_answers_on_a_hugging_face_model_in_the_registrys_order() -> None:
    """vLLM judges the folder; each engine of a format of its own refuses it with its fix."""
    code, data = run_json("check-model", "Qwen/Qwen3-0.6B")
    assert code == 0
    assert [e["engine"] for e in data["engines"]] == [e.name for e in ENGINES]
    assert data["engines"][0]["supported"] is True
    holder = format_of(InspectRequest("Qwen/Qwen3-0.6B"))
    assert holder.catch_all and data["engines"][0]["engine"] == holder.engine
    refusals = {e["engine"]: e for e in data["engines"][1:]}
    others = [f for f in model_formats() if f is not holder]
    assert sorted(refusals) == sorted(f.engine for f in others)
    for own_format in others:
        refusal = refusals[own_format.engine]
        assert refusal["supported"] is False
        assert refusal["reason"] == own_format.elsewhere(holder, InspectRequest("m")).reason


def test_check_model_table_and_version_option() -> None:
    result = run("check-model", "THUDM/glm-4-9b-chat-hf", "--vllm-version", "0.32.0")
    assert result.exit_code == 0
    assert "GlmForCausalLM" in result.stdout
    assert "0.32.0 (table 0.32.0)" in result.stdout
    assert "/v1/chat/completions" in result.stdout


def test_check_model_bad_input_exits_2() -> None:
    result = run("check-model", "not a model")
    assert result.exit_code == 2
    assert "org/name" in result.stderr


def test_estimate_llama_8b_128k_x4_on_64_gib() -> None:
    code, data = run_json(
        "estimate", "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len", "131072", "--max-num-seqs", "4", "--socket-gb", "64",
    )  # fmt: skip
    assert code == 1
    assert set(data) >= ESTIMATE_KEYS
    assert data["fits"] is False
    assert data["kv_bytes_per_token"] == 131072
    assert data["context"] == 131072 and data["kv_gb"] == 64.0
    suggested = data["suggested_max_model_len"]
    assert suggested == 51200
    code, again = run_json(
        "estimate", "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len", str(suggested), "--max-num-seqs", "4", "--socket-gb", "64",
    )  # fmt: skip
    assert code == 0 and again["fits"] is True and again["action"] == "fits"


def test_estimate_70b_on_64_gib() -> None:
    code, data = run_json(
        "estimate", "meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "4096",
        "--socket-gb", "64",
    )  # fmt: skip
    assert code == 1
    assert data["suggested_max_model_len"] is None
    assert "does not fit in socket memory" in data["action"]


def test_estimate_default_is_what_a_balanced_plan_fits_at_full_context() -> None:
    """Not one sequence (docs/tuning.md rule 2): vLLM's 128, cut to the full-context sequences
    whose KV (+10 %) the 32 GiB socket's 16 GiB pool cap holds."""
    code, data = run_json("estimate", "Qwen/Qwen3-0.6B", "--socket-gb", "32")
    assert code == 0
    per_sequence_gib = 40960 * 114688 * 1.1 / 1024**3
    assert data["context"] == 40960
    assert data["max_num_seqs"] == int(16 // per_sequence_gib) == 3
    result = run("estimate", "Qwen/Qwen3-0.6B", "--socket-gb", "32")
    assert "KV per token" in result.stdout and "114688 bytes" in result.stdout


def test_estimate_bad_values_exit_2() -> None:
    assert (
        run("estimate", "Qwen/Qwen3-0.6B", "--max-num-seqs", "0", "--socket-gb", "8").exit_code == 2
    )
    assert run("estimate", "Qwen/Qwen3-0.6B", "--socket-gb", "-1").exit_code == 2


def test_estimate_on_a_detected_nps4_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_host(tmp_path, "genoa-9654-2s-nps4")
    monkeypatch.setenv("EPYCD_HOST_ROOT", str(root))
    code, data = run_json(
        "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "131072",
        "--max-num-seqs", "16",
    )  # fmt: skip
    host = detect_host(root, probe_runtimes=False)
    sock = host.socket(0)
    first = host.node(sock.numa_nodes[0]).memory_available_bytes / 1024**3
    weights = LLAMA_8B_TOTAL_SIZE / 1024**3
    resident = weights + data["runtime_gb"]  # the server holds both before its pool
    assert data["runtime_gb"] > 1.0
    expected_pool = min(
        kv_pool_gib(sock.memory_gb),
        math.floor(sock.memory_available_gb - resident - headroom_gib(sock.memory_gb)),
        math.floor(first - resident * first / sock.memory_available_gb),
    )
    assert len(sock.numa_nodes) == 4
    assert data["kv_pool_gb"] == expected_pool < kv_pool_gib(sock.memory_gb)  # the node binds
    assert data["available_gb"] == round(sock.memory_available_gb, 2)
    assert "NUMA nodes 0, 1, 2, 3" in data["socket"]
    assert code == (0 if data["fits"] else 1)
