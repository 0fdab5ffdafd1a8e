"""The typed vLLM invocation (epycd.engines.vllm.plan.invocation): a record, frozen, with no
unknown key, its engine told apart by `kind`. tests/render/test_argv.py holds it and its argv
builder to the planner's argv, word for word."""

from __future__ import annotations

import pytest

from epycd.engines.vllm.plan.invocation import CpuEngine, RocmEngine, VllmInvocation
from epycd.spec.flags import ExtraFlags


def invocation(engine: CpuEngine | RocmEngine, extra: list[str]) -> VllmInvocation:
    return VllmInvocation(
        model_arg="m", dtype="bfloat16", max_model_len=8192, host="::", port=8000,
        served_model_name="m", extra=ExtraFlags.of(extra), engine=engine,
    )  # fmt: skip


ROCM = RocmEngine(recipe_args=["--block-size", "1"], tensor_parallel_size=2,
                  distributed_executor_backend="mp")  # fmt: skip
CPU = CpuEngine(omp_cpus="0-61", max_num_seqs=128, max_num_batched_tokens=2048)


@pytest.mark.parametrize("engine", [ROCM, CPU], ids=["rocm", "cpu"])
def test_it_round_trips_as_json(engine: CpuEngine | RocmEngine) -> None:
    made = invocation(engine, ["--enforce_eager"])
    again = VllmInvocation.model_validate_json(made.model_dump_json())
    assert again == made and type(again.engine) is type(engine)
    assert again.extra.given("--enforce-eager")


def test_it_is_frozen_and_knows_its_keys() -> None:
    made = invocation(CPU, [])
    with pytest.raises(ValueError, match="frozen"):
        made.port = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="Extra inputs"):
        VllmInvocation.model_validate({**made.model_dump(), "argv": []})
    with pytest.raises(ValueError, match="without tensor parallelism"):
        RocmEngine(distributed_executor_backend="mp")


@pytest.mark.parametrize(
    ("engine", "extra", "eager"),
    [
        (CPU, [], False),
        (CPU.model_copy(update={"enforce_eager": True}), [], True),
        (CPU, ["--enforce-eager"], True),
        (CPU, ["--enforce_eager"], True),
        (ROCM, [], False),
        (ROCM.model_copy(update={"recipe_args": ["--enforce-eager"]}), [], True),
    ],
)
def test_eager_is_the_plans_the_files_or_the_recipes(
    engine: CpuEngine | RocmEngine, extra: list[str], eager: bool
) -> None:
    assert invocation(engine, extra).eager is eager
