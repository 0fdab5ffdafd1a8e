"""`epycctl instinct-recipes --from FILE`: the recipe's recipes_cache.json -> the vendored
recipe data, offline; bad input exit 2 and nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

from epycd.model.instinct import load_recipes, recipe_for
from tests.sandbox import run_python

CACHE = {
    "fetched_at": "2026-11-29T08:00:00Z",
    "docker_image": "vllm/vllm-openai-rocm:v0.19.0",
    "models": {
        "Qwen/Qwen3.5-9B": {
            "recipe": {
                "model": {"base_args": ["--max-model-len", "32768", "--trust-remote-code"],
                          "base_env": {"VLLM_USE_V1": "1"}, "min_vllm_version": "0.17.0"},
                "features": {"tool_calling": {"args": ["--tool-call-parser", "qwen3_coder"]},
                             "reasoning": {"args": ["--reasoning-parser", "qwen3"]}},
                "hardware_overrides": {"amd": {"extra_args": ["--tensor-parallel-size", "8"],
                                               "extra_env": {"VLLM_ROCM_USE_AITER": "1"}}},
            }
        },
        "deepseek-ai/DeepSeek-V3": {"recipe": {"model": {"base_args": ["--block-size", "1"]}}},
    },
}  # fmt: skip


def refresh(tmp_path: Path, cache: object) -> tuple[int, str, str, Path]:
    source = tmp_path / "recipes_cache.json"
    source.write_text(json.dumps(cache))
    out = tmp_path / "instinct-recipes.json"
    argv = ["-m", "epycd", "instinct-recipes", "--from", str(source), "--out", str(out)]
    done = run_python(argv, env=os.environ)
    return done.returncode, done.stdout, done.stderr, out


def test_refresh_converts_and_drops_what_the_plan_owns(tmp_path: Path) -> None:
    code, stdout, stderr, out = refresh(tmp_path, CACHE)
    assert code == 0, stderr
    recipes = load_recipes(out)
    assert recipes.fetched_at == "2026-11-29T08:00:00Z"
    assert recipes.docker_image == "vllm/vllm-openai-rocm:v0.19.0"
    found = recipe_for("Qwen/Qwen3.5-9B", recipes)
    assert found is not None
    recipe = found[1]
    assert recipe.base_args == ["--trust-remote-code"]
    assert recipe.tool_calling_args == ["--tool-call-parser", "qwen3_coder"]
    assert recipe.amd_extra_args == [] and recipe.amd_extra_env == {"VLLM_ROCM_USE_AITER": "1"}
    assert "--max-model-len" in stdout and "--tensor-parallel-size" in stdout
    deepseek = recipe_for("deepseek-ai/DeepSeek-V3", recipes)
    assert deepseek is not None and deepseek[1].moe  # kept from the shipped data


def test_a_bad_cache_is_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    code, _stdout, stderr, out = refresh(tmp_path, {"fetched_at": "x", "models": {}})
    assert code == 2
    assert "recipes_cache.json" in stderr and "models" in stderr
    assert "Traceback" not in stderr
    assert not out.exists()
