"""Embedding and reranker models in endpoint files: vLLM's pooling runner serves them on
their own paths, sized as encoders (docs/tuning.md, "Embedding and reranker models");
llama.cpp refuses them, for now, with that reason and what serves them meanwhile; the other
endpoints plan as before."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from gguf import GGMLQuantizationType

from epycd.engines.llama_cpp.model.memory import encoder_compute_bytes
from epycd.engines.vllm.export.kube import RESERVED_CPUS_ENV, pod_env
from epycd.engines.vllm.model.memory import MIN_POOL_GIB
from epycd.engines.vllm.plan.tuning import batch_target, front_end_cores
from epycd.engines.vllm.render.policy import check_pinning
from epycd.errors import InputError
from epycd.host.cpulist import parse_cpulist
from epycd.host.facts import HostFacts
from tests.model.gguf_files import GgufShape, write_gguf
from tests.model.hf_cache import add_to_cache
from tests.model.models import model_files
from tests.plan.conftest import PlanWorkspace, cpu
from tests.plan.test_llama_plan import LlamaWorkspace

HostOf = Callable[..., HostFacts]


def _cached_models(ws: PlanWorkspace, monkeypatch: pytest.MonkeyPatch) -> None:
    for repo_id, files in model_files().items():
        add_to_cache(ws.hf_home / "hub", repo_id, files)
    monkeypatch.setenv("HF_HOME", str(ws.hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _flag(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def longest_input_of(model: str) -> int:
    """What vLLM takes of the cached model's files: sentence-transformers' max_seq_length,
    else the positions cut to the tokenizer's model_max_length."""
    files = {name: json.loads(data) for name, data in model_files()[model].items()
             if isinstance(data, bytes)}  # fmt: skip
    if "sentence_bert_config.json" in files:
        return int(files["sentence_bert_config.json"]["max_seq_length"])
    positions = files["config.json"]["max_position_embeddings"]
    return int(min(positions, files["tokenizer_config.json"]["model_max_length"]))


@pytest.mark.parametrize(
    ("model", "endpoint"),
    [("BAAI/bge-small-en-v1.5", "embeddings"), ("BAAI/bge-reranker-base", "rerank")],
)
def test_a_pooling_model_plans_on_vllms_pooling_runner_beside_a_chat_endpoint(
    ws: PlanWorkspace,
    host_of: HostOf,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    endpoint: str,
) -> None:
    """Its own path for the gate, `--runner pooling`, the model's own sequence limit (not
    the stack's chat context), one step holding a whole input, the profile's sequences
    uncut by a context-sized KV budget, and no streaming flag; the chat endpoint beside it
    plans as before."""
    _cached_models(ws, monkeypatch)
    ws.endpoint("pooled", f'model = "{model}"\n')
    ws.endpoint("chat")
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    pooled, chat = results["pooled"].plan, results["chat"].plan
    assert pooled is not None, results["pooled"].errors
    assert chat is not None, results["chat"].errors
    decided = cpu(pooled)
    positions = longest_input_of(model)
    assert decided.primary_endpoint == endpoint
    assert _flag(decided.vllm_args, "--runner") == "pooling"
    assert decided.max_model_len == positions
    batched = _flag(decided.vllm_args, "--max-num-batched-tokens")
    assert batched is not None and int(batched) >= positions
    assert decided.max_num_seqs == batch_target("balanced", 1).max_num_seqs
    assert decided.kv_cache_gb == MIN_POOL_GIB
    assert "--stream-interval" not in decided.vllm_args
    hidden = json.loads(model_files()[model]["config.json"])["hidden_size"]  # type: ignore[arg-type]
    width = hidden if endpoint == "embeddings" else None
    assert decided.embedding_width == width, "the gate's width (where a gate runs)"
    assert "--runner" not in cpu(chat).vllm_args
    assert cpu(chat).primary_endpoint == "chat_completions"


def test_the_throughput_profile_batches_more_inputs_of_an_embedder(
    ws: PlanWorkspace, host_of: HostOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cached_models(ws, monkeypatch)
    for profile in ("latency", "balanced", "throughput"):
        ws.endpoint(profile, f'model = "BAAI/bge-small-en-v1.5"\nprofile = "{profile}"\n')
    results = ws.plan(host_of("genoa-9654-2s-nps4"))
    sizes = {}
    for profile, result in results.items():
        assert result.plan is not None, result.errors
        decided = cpu(result.plan)
        sizes[profile] = (decided.max_num_seqs,
                          decided.max_num_batched_tokens)  # fmt: skip
    assert sizes["latency"] < sizes["balanced"] < sizes["throughput"], sizes


def test_an_embedder_asked_for_more_than_its_length_is_capped_and_told(
    ws: PlanWorkspace, host_of: HostOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cached_models(ws, monkeypatch)
    ws.endpoint("pooled", 'model = "BAAI/bge-small-en-v1.5"\nmax_model_len = 8192\n')
    plan = ws.plan(host_of("genoa-9654-2s-nps1"))["pooled"].plan
    assert plan is not None
    assert cpu(plan).max_model_len == 512
    assert any("capped to the model's 512" in w for w in cpu(plan).warnings)


@pytest.mark.parametrize(
    ("pooling", "flag", "endpoint"),
    [(3, "--embeddings", "embeddings"), (4, "--rerank", "rerank")],
)
def test_a_pooling_gguf_plans_on_llama_server_with_its_flag_and_a_whole_input_per_step(
    ws: PlanWorkspace, host_of: HostOf, pooling: int, flag: str, endpoint: str
) -> None:
    """A qwen2 file of pooling type last (an embedder, as Qwen3-Embedding's GGUF) or rank (a
    reranker): llama-server's flag, one step as long as the context (-ub and -b), no prompt
    cache; the gate's path and, for the embedder, the file's width; the chat endpoint beside
    it plans as before."""
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))
    path = ws.tmp / "pooled.gguf"
    shape = GgufShape(layers=2, embedding=128, heads=4, kv_heads=2, feed_forward=512, vocab=300,
                      extra={"{arch}.pooling_type": pooling}, context=2048)  # fmt: skip
    write_gguf(path, shape)
    lw.endpoint("pooled", f'model = "{path}"\n')
    lw.endpoint("chat")
    plan, decided = lw.planned("pooled")
    args = decided.server_args
    assert flag in args and "--embeddings" not in args[args.index(flag) + 1 :]
    assert decided.primary_endpoint == endpoint
    context = decided.invocation.context
    assert context == shape.context
    assert _flag(args, "--ubatch-size") == _flag(args, "--batch-size") == str(context)
    assert _flag(args, "--cache-ram") == "0"
    assert decided.embedding_width == (shape.embedding if endpoint == "embeddings" else None)
    [unit] = plan.units.values()
    assert f"--endpoint {endpoint} " in unit
    _, chat = lw.planned("chat")
    assert flag not in chat.server_args and _flag(chat.server_args, "--ubatch-size") == "512"


MIB = 1024**2


@pytest.mark.parametrize(
    ("head", "flag", "endpoint"),
    [(None, "--embeddings", "embeddings"), (1, "--rerank", "rerank")],
)
def test_a_bert_gguf_plans_as_an_encoder_with_no_kv_cache(
    ws: PlanWorkspace, host_of: HostOf, head: int | None, flag: str, endpoint: str
) -> None:
    """A BERT file (and one with a one-output classifier head: a converted reranker) plans
    with rule 9's encoder terms: no KV cache, the compute buffer at the context's batch, the
    output holding each slot's vector."""
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))
    path = ws.tmp / "bert.gguf"
    matrices = {} if head is None else {"cls.output.weight": (GGMLQuantizationType.F32, head, 128)}
    write_gguf(path, GgufShape(architecture="bert", feed_forward=512, vocab=300, context=512,
                               matrices=matrices))  # fmt: skip
    lw.endpoint("pooled", f'model = "{path}"\n')
    _, decided = lw.planned("pooled")
    assert decided.primary_endpoint == endpoint and flag in decided.server_args
    memory = decided.fit.memory
    assert memory.kv_bytes <= MIB  # none: llama.cpp prints 0 MiB, which the plan holds as 1
    assert memory.ubatch == decided.invocation.context == 512
    # llama.cpp's pass prints whole MiB, rounded down; the plan raises each by 1 MiB
    printed = encoder_compute_bytes(128, 512, 512, memory.slots) // MIB
    assert memory.source == "llama.cpp" and memory.compute_bytes == (printed + 1) * MIB
    assert memory.output_bytes == (300 + 128) * memory.slots * 4


def test_an_encoder_the_formulas_do_not_cover_is_asked_of_llama_cpp_and_the_others_plan(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """An encoder GGUF whose compute buffer the formulas do not cover (nomic-bert) is an
    embedder to check-model, and its fit is llama-server's own pass; a llama-server that
    loads nothing of it and says nothing (this workspace's stand-in, as llama.cpp often does
    with a file it cannot load) refuses it naming the model key and llama.cpp, and nothing
    else changes."""
    lw = LlamaWorkspace(ws, host_of("genoa-9654-2s-nps1"))
    path = ws.tmp / "nomic.gguf"
    write_gguf(path, GgufShape(architecture="nomic-bert", feed_forward=512, vocab=300))
    lw.endpoint("pooled", f'model = "{path}"\n')
    lw.endpoint("chat")
    results = lw.plan()
    [problem] = results["pooled"].errors
    assert problem.key == "model"
    assert "llama.cpp cannot say the memory of serving nomic.gguf" in problem.text
    assert "could not load it and printed no reason" in problem.text
    assert "check-model" in (problem.fix or "")
    assert results["chat"].plan is not None


@pytest.mark.parametrize("host", ["vm-zen5", "vm-offline-cpu", "vm-16"])
def test_an_embedder_on_a_few_cores_binds_them_all_and_a_chat_endpoint_keeps_one_back(
    ws: PlanWorkspace, host_of: HostOf, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    """Rule 1 for an encoder: on an instance of up to 4 cores OpenMP takes every core (one
    held back is a quarter or more of the compute, and an encoder's front end only tokenizes
    and answers); from 5 cores one is left to the front end, as for a chat endpoint, which
    always keeps one back. The render policy passes both binds, and the Kubernetes export
    tells vLLM's own bind in the pod to keep as many back."""
    assert [front_end_cores(n, pooling=True) for n in (1, 2, 4, 5, 63, 64)] == [0, 0, 0, 1, 1, 2]
    assert [front_end_cores(n) for n in (1, 2, 4, 5)] == [0, 1, 1, 1]
    _cached_models(ws, monkeypatch)
    ws.endpoint("pooled", 'model = "BAAI/bge-small-en-v1.5"\n')
    results = ws.plan(host_of(host))
    pooled = results["pooled"].plan
    assert pooled is not None, results["pooled"].errors
    decided = cpu(pooled)
    cores = len(parse_cpulist(decided.cpus))
    bound = cores if cores <= 4 else cores - 1
    bind = parse_cpulist(decided.env["VLLM_CPU_OMP_THREADS_BIND"])
    assert bind == parse_cpulist(decided.omp_cpus) == parse_cpulist(decided.cpus)[:bound]
    assert front_end_cores(cores) == 1, "a chat endpoint on the same cores keeps one back"
    check_pinning(decided)
    assert pod_env(decided)[RESERVED_CPUS_ENV] == str(cores - bound)
    if bound == cores:
        as_chat = decided.model_copy(update={"primary_endpoint": "chat_completions"})
        with pytest.raises(InputError, match="none is left to vLLM's API server"):
            check_pinning(as_chat)
