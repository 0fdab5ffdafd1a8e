"""The typed vLLM invocation and its one argv builder (epycd.engines.vllm.plan.invocation,
epycd.engines.vllm.plan.argv), held word for word to what the planner writes today.

For every endpoint the real planner plans here (each golden case, instance-set members and
Instinct endpoints included, and the cases below for what the goldens lack: a revision, a
chat template, extra_args, eager by rule 4 or by the recipe's tight VRAM, the stream
interval, a MoE recipe over several GPUs), `invocation_from_record` derives the invocation from the
flat decisions, `vllm_argv` gives back `vllm_args` exactly, `bench_engine_argv` gives what
the stored invocation gives, and `epycctl bench --offline` runs it (`epycd.engines.vllm.cli.bench
.engine_args`: the stored invocation's, a set's first member's; it no longer reads the argv,
see the bench tests below).
This table is the safety net for wiring the invocation into the planner and the units.
The renderer's hand-written decisions (tests/render/fixtures.py) have an
argv of an older order, which a record keeps as it is (`approved_argv`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from epycd.engines.vllm.cli.bench import engine_args, offline_target
from epycd.engines.vllm.plan.argv import bench_engine_argv, vllm_argv
from epycd.engines.vllm.plan.invocation import CpuEngine, RocmEngine, VllmInvocation
from epycd.engines.vllm.plan.model import (
    AnyVllmServer,
    VllmCpuServer,
    VllmInstinctServer,
    vllm_processes,
)
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, HostVllmFacts, RuntimeFacts
from epycd.model import instinct
from epycd.plan.endpoint import Plan
from epycd.plan.pipeline.result import EndpointResult
from epycd.spec.flags import ExtraFlags
from tests.hosts import CATALOGUE, FakeGpu, write_host
from tests.instinct.conftest import DOCKER, workspace_in
from tests.plan.conftest import PODMAN_5, PlanWorkspace, fake_host
from tests.render.argv_records import invocation_from_record
from tests.render.fixtures import CASES as HAND_WRITTEN
from tests.render.fixtures import cpu_decisions
from tests.render.test_golden import CASES as GOLDEN_CASES
from tests.render.test_golden import PRODUCT_PYTHON, case_folder, plan_results
from tests.secrets import root_folder


def instances(plan: Plan) -> list[AnyVllmServer]:
    """The decisions of each vLLM process: a set's members, or the endpoint's own."""
    return vllm_processes(plan.decisions)


def assert_reproduced(plan: Plan) -> list[VllmInvocation]:
    """Each instance's invocation gives back its argv and the stored invocation's bench
    arguments, which the bench runs (a set's first member's)."""
    invocations = []
    for decisions in instances(plan):
        invocation = invocation_from_record(decisions)
        assert invocation.approved_argv is None
        assert vllm_argv(invocation) == decisions.vllm_args, decisions.unit_name
        assert decisions.invocation is not None
        bench = bench_engine_argv(decisions.invocation)
        assert bench_engine_argv(invocation) == bench == engine_args(decisions)
        invocations.append(invocation)
    # the offline bench of a set runs its first member
    assert engine_args(offline_target(plan)) == bench_engine_argv(invocations[0])
    return invocations


def planned(result: EndpointResult) -> Plan:
    assert result.plan is not None, [p.text for p in result.errors]
    return result.plan


GOLDEN_SHAPES = {
    "docker-exposed-key": [("olmo-key", "cpu", 1, 1)],
    "extra-args-consent": [("qwen", "cpu", 1, 1)],
    "gated-podman-token": [("llama", "cpu", 1, 1)],
    "genoa-podman": [("qwen", "cpu", 1, 1)],
    "host-ipv6-key": [("host-key", "cpu", 1, 1)],
    "host-vllm": [("host-qwen", "cpu", 1, 1)],
    "host-vllm-token": [("host-llama", "cpu", 1, 1)],
    "instances-docker-milan": [("olmo", "cpu", 2, 1)],
    "instances-host-vllm": [("multi", "cpu", 4, 1)],
    "instances-podman-nps4": [("qwen", "cpu", 4, 1)],
    "instinct-mi210-podman": [("qwen", "rocm", 1, 1)],
    "instinct-mi300x-podman": [("cpu", "cpu", 1, 1), ("gpu", "rocm", 1, 1)],
    "instinct-mi355x-docker": [("llama", "rocm", 1, 2)],
    "milan-docker": [("olmo", "cpu", 1, 1)],
    "podman-before-5": [("qwen-old", "cpu", 1, 1)],
    "podman-before-5-key": [("qwen-key", "cpu", 1, 1)],
    "pooling-podman": [("embed", "cpu", 4, 1), ("rerank", "cpu", 1, 1)],
}
"""Each golden endpoint: its engine, its vLLM instances, its tensor-parallel size."""


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_every_golden_argv(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with case_folder(case, tmp_path) as folder:
        results = plan_results(case, folder, monkeypatch)
    shapes = []
    for name, result in sorted(results.items()):
        invocations = assert_reproduced(planned(result))
        engine = invocations[0].engine
        tp = engine.tensor_parallel_size if isinstance(engine, RocmEngine) else 1
        shapes.append((name, engine.kind, len(invocations), tp))
    assert shapes == GOLDEN_SHAPES[case]


# The cases the goldens lack, planned by the real planner on the golden hosts.

QWEN = 'model = "Qwen/Qwen3-0.6B"\n'
GPU = 'device = "instinct"\n'
HOST_VLLM = 'runtime = "host"\nvllm = "/opt/vllm-env/bin/vllm"\n'


@pytest.fixture
def ws(monkeypatch: pytest.MonkeyPatch) -> Iterator[PlanWorkspace]:
    """The test models in an offline HF cache, and a token file (Llama is gated) in a folder
    only root controls (tests/instinct/conftest.py)."""
    with root_folder() as folder:
        yield workspace_in(folder, monkeypatch)


def plan_one(ws: PlanWorkspace, host: HostFacts, text: str, version: str = "0.32.0") -> Plan:
    ws.endpoint("e", text)

    def probe(executable: str) -> HostVllmFacts:
        return HostVllmFacts(path=executable, present=True, version=version,
                             platform="ZenCpuPlatform")  # fmt: skip

    return planned(ws.plan(host, probe=probe, product_python=PRODUCT_PYTHON)["e"])


def template(ws: PlanWorkspace) -> str:
    path = ws.tmp / "templates" / "chatml.jinja"
    path.parent.mkdir(exist_ok=True)
    path.write_text("{{ messages }}")
    return str(path)


def genoa(ws: PlanWorkspace, *, cxx: bool = True) -> HostFacts:
    host = fake_host(ws.tmp, "genoa-9654-2s-nps1")
    return host if cxx else host.model_copy(update={"cxx_compiler": None})


def test_a_container_with_revision_template_and_extra_args(ws: PlanWorkspace) -> None:
    plan = plan_one(
        ws,
        fake_host(ws.tmp, "genoa-9654-2s-nps4"),
        QWEN + 'revision = "main"\nserved_model_name = "qwen"\n'
        f'chat_template = "{template(ws)}"\n'
        'extra_args = ["--max-num-batched-tokens", "4096", "--enable-prefix-caching", '
        '"--trust-remote-code", "--override-generation-config={\\"temperature\\": 0.5}"]\n',
    )
    [inv] = assert_reproduced(plan)
    assert (inv.revision, inv.chat_template) == ("main", template(ws))
    assert isinstance(inv.engine, CpuEngine) and not inv.engine.pass_batched_tokens
    assert inv.engine.max_num_batched_tokens == 4096
    assert inv.extra.value("--max-num-batched-tokens") == "4096"


@pytest.mark.parametrize("profile", ["latency", "balanced", "throughput"])
def test_a_host_vllm_by_profile(ws: PlanWorkspace, profile: str) -> None:
    """0.32: the pool in bytes; the profile's stream interval (none for latency)."""
    plan = plan_one(ws, genoa(ws), QWEN + HOST_VLLM + f'profile = "{profile}"\n')
    [inv] = assert_reproduced(plan)
    assert isinstance(inv.engine, CpuEngine) and inv.engine.kv_cache_memory_bytes
    assert inv.engine.stream_interval == {"latency": None, "balanced": 4, "throughput": 10}[profile]


@pytest.mark.parametrize("extra", [[], ["--stream-interval", "2"]])
def test_a_host_vllm_without_a_compiler_runs_eager(ws: PlanWorkspace, extra: list[str]) -> None:
    """The plan's --enforce-eager, then its stream interval unless the file gives one."""
    plan = plan_one(
        ws, genoa(ws, cxx=False), QWEN + HOST_VLLM + f"extra_args = {json.dumps(extra)}\n"
    )
    [inv] = assert_reproduced(plan)
    assert isinstance(inv.engine, CpuEngine) and inv.engine.enforce_eager and inv.eager
    assert inv.engine.stream_interval == (None if extra else 4)
    assert inv.extra.value("--stream-interval") == (extra[1] if extra else None)


def test_an_older_vllm_gets_the_gib_variable(ws: PlanWorkspace) -> None:
    plan = plan_one(ws, genoa(ws), QWEN + HOST_VLLM, version="0.11.0")
    [inv] = assert_reproduced(plan)
    assert isinstance(inv.engine, CpuEngine)
    assert (inv.engine.kv_cache_memory_bytes, inv.engine.stream_interval) == (None, None)


def test_instance_set_members_with_extra_args(ws: PlanWorkspace) -> None:
    plan = plan_one(
        ws,
        genoa(ws),
        QWEN + HOST_VLLM + 'instances = 2\nsocket = 0\nrevision = "main"\n'
        f'chat_template = "{template(ws)}"\nextra_args = ["--enable-prefix-caching"]\n',
    )
    members = assert_reproduced(plan)
    assert len(members) == 2 and len({m.port for m in members}) == 2
    assert all(m.extra.words == ("--enable-prefix-caching",) for m in members)


def test_instinct_tight_vram_with_max_num_seqs_and_extra_args(ws: PlanWorkspace) -> None:
    """Llama 3.1 8B on a 22 GiB GPU: the tight tier, eager (tests/instinct)."""
    shape = replace(CATALOGUE["genoa-1x-mi210"], gpus=(FakeGpu(90402, 22, 0),))
    root = write_host(ws.tmp / "shaped", shape)
    small = detect_host(root, probe_runtimes=False).model_copy(
        update={"runtimes": RuntimeFacts(podman=PODMAN_5)}
    )
    plan = plan_one(
        ws,
        small,
        GPU + 'model = "meta-llama/Llama-3.1-8B-Instruct"\nmax_num_seqs = 16\n'
        f'hf_token_file = "{ws.tmp / "secrets" / "hf.token"}"\n'
        f'chat_template = "{template(ws)}"\nextra_args = ["--kv-cache-dtype", "fp8"]\n',
    )
    gpu = plan.decisions.first
    assert isinstance(gpu, VllmInstinctServer)
    assert gpu.gpu_fit.tier == "tight"
    [inv] = assert_reproduced(plan)
    assert isinstance(inv.engine, RocmEngine) and inv.engine.enforce_eager and inv.eager
    assert inv.engine.max_num_seqs == 16 and inv.engine.recipe_args


def test_instinct_moe_recipe_over_two_gpus(
    ws: PlanWorkspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MoE recipe (as DeepSeek's) spread over 2 GPUs: the executor backend `mp`, the
    recipe's own args between the plan's."""
    data = json.loads(instinct.data_path(instinct.RECIPES_FILE).read_text())
    data["models"]["Qwen/Qwen3-0.6B"] = {
        "base_args": ["--block-size", "1"],
        "tool_calling_args": ["--tool-call-parser", "hermes"],
        "moe": True,
    }
    recipes = tmp_path / instinct.RECIPES_FILE
    recipes.write_text(json.dumps(data))
    shipped = instinct.data_path

    def data_path(name: str) -> Path:
        return recipes if name == instinct.RECIPES_FILE else shipped(name)

    monkeypatch.setattr(instinct, "data_path", data_path)
    instinct.shipped_recipes.cache_clear()
    try:
        plan = plan_one(
            ws,
            fake_host(ws.tmp, "genoa-2s-8x-mi300x"),
            GPU + QWEN + "tensor_parallel_size = 2\n",
        )
    finally:
        instinct.shipped_recipes.cache_clear()
    [inv] = assert_reproduced(plan)
    assert isinstance(inv.engine, RocmEngine)
    assert inv.engine.distributed_executor_backend == "mp"
    assert inv.engine.recipe_args == [
        "--block-size", "1", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
    ]  # fmt: skip
    # the bench gets the recipe's engine flags, not its API server's (tool calling), and
    # the GPUs' tensor parallelism and backend
    assert engine_args(offline_target(plan))[6:] == [
        "--block-size", "1", "--tensor-parallel-size", "2",
        "--distributed-executor-backend", "mp",
    ]  # fmt: skip


def test_instinct_on_docker(ws: PlanWorkspace) -> None:
    host = fake_host(ws.tmp, "genoa-2s-8x-mi300x", DOCKER)
    plan = plan_one(ws, host, GPU + QWEN + 'revision = "main"\nextra_args = ["--seed", "7"]\n')
    [inv] = assert_reproduced(plan)
    assert inv.revision == "main" and inv.extra.words == ("--seed", "7")


# What the bench reads differently from the argv it read before, on purpose: every spelling of
# the grammar, and an Instinct recipe's engine flags with the tensor parallel size.


def test_the_bench_reads_the_files_flags_in_every_spelling(ws: PlanWorkspace) -> None:
    """`--max_num_batched_tokens=8192` and `--enforce_eager`: vLLM serves with both, and so
    does the bench now (reading the argv it saw only the exact `--flag value` words). The
    plan reads the file's batch size in the same grammar and passes none of its own."""
    plan = plan_one(
        ws,
        genoa(ws),
        QWEN + HOST_VLLM + 'profile = "throughput"\n'
        'extra_args = ["--max_num_batched_tokens=8192", "--enforce_eager"]\n',
    )
    [inv] = [invocation_from_record(d) for d in instances(plan)]
    server = plan.decisions.first
    assert isinstance(server, VllmCpuServer)
    assert vllm_argv(inv) == server.vllm_args
    assert isinstance(inv.engine, CpuEngine) and not inv.engine.pass_batched_tokens
    assert inv.engine.max_num_batched_tokens == 8192
    assert not inv.engine.enforce_eager and inv.eager
    kv = str(inv.engine.kv_cache_memory_bytes)
    decisions = cpu_decisions(plan)
    assert engine_args(decisions) == bench_engine_argv(inv) == [
        "--model", "Qwen/Qwen3-0.6B", "--dtype", "bfloat16", "--max-model-len", "4096",
        "--max-num-seqs", str(inv.engine.max_num_seqs), "--kv-cache-memory-bytes", kv,
        "--max-num-batched-tokens", "8192", "--enforce-eager",
    ]  # fmt: skip
    # a record from before the invocation: its words, read with the same grammar
    before = decisions.model_copy(
        update={"invocation": None, "recorded_vllm_args": decisions.vllm_args}
    )
    assert engine_args(before) == bench_engine_argv(inv)


# The hand-written decisions of the renderer's tests (tests/render/fixtures.py).


@pytest.mark.parametrize("case", sorted(HAND_WRITTEN))
def test_a_hand_written_argv_is_kept_as_approved(case: str) -> None:
    """Their argv has an older order (--host first, no batch size): the fields do not give
    it back, so a record of it keeps its words (`approved_argv`), emitted as they are."""
    decisions = HAND_WRITTEN[case]()
    invocation = invocation_from_record(decisions)
    assert vllm_argv(invocation) != decisions.vllm_args
    kept = invocation.model_copy(update={"approved_argv": list(decisions.vllm_args)})
    assert vllm_argv(kept) == decisions.vllm_args
    assert (kept.model_arg, kept.host, kept.port) == (
        decisions.vllm_args[0],
        decisions.host,
        decisions.port,
    )


def test_the_instinct_order_with_every_flag() -> None:
    """Tensor parallelism, its backend and eager together, which no planned case has."""
    invocation = VllmInvocation(
        model_arg="m", dtype="bfloat16", max_model_len=8192, host="::", port=8000,
        served_model_name="m", revision="r", chat_template="/t", extra=ExtraFlags.of(["--x"]),
        engine=RocmEngine(max_num_seqs=4, recipe_args=["--block-size", "1"],
                          tensor_parallel_size=2, distributed_executor_backend="mp",
                          enforce_eager=True),
    )  # fmt: skip
    assert vllm_argv(invocation) == [
        "m", "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4",
        "--block-size", "1", "--tensor-parallel-size", "2", "--distributed-executor-backend",
        "mp", "--enforce-eager", "--host", "::", "--port", "8000", "--served-model-name", "m",
        "--revision", "r", "--chat-template", "/t", "--x",
    ]  # fmt: skip
    assert bench_engine_argv(invocation) == [
        "--model", "m", "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4",
        "--block-size", "1", "--tensor-parallel-size", "2", "--distributed-executor-backend",
        "mp", "--revision", "r", "--enforce-eager",
    ]  # fmt: skip
