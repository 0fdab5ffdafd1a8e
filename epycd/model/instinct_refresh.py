"""`epycctl instinct-recipes --from FILE`: the recipe's `recipes_cache.json` (synced from
vllm-project/recipes by the recipe's own script, elsewhere) -> `data/instinct-recipes.json`,
offline. The cache's shape, as the Instinct recipe describes it (docs/instinct.md, "Refreshing
the recipe data"): top-level `fetched_at` and `docker_image`; `models.<HF_ID>.recipe` with
`model.base_args`, `model.base_env`, `model.min_vllm_version`, `features.tool_calling.args`,
`features.reasoning.args`, `hardware_overrides.amd.extra_args`,
`hardware_overrides.amd.extra_env`.

Flags the plan owns (epycd.spec.policy.ARGS_OWNED_BY_PLAN: the tensor-parallel size, the port...)
are dropped from the recipes, each named in the report: the plan decides them. What the
current data knows that the cache does not (MoE models, generic args) is kept, and so is
the pinned image when the cache names a floating one (`:latest`): an approval binds the
image, and a tag a later pull can move would not hold it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from epycd.errors import InputError
from epycd.model.instinct import InstinctRecipes, Recipe, floats
from epycd.spec.policy import arg_refusal

CACHE_FIX = "give the recipe's data/recipes_cache.json (models.<HF_ID>.recipe...)"


class RefreshReport(BaseModel):
    source: str
    written: str
    fetched_at: str
    docker_image: str
    models: int
    dropped: list[str]


def _strings(value: Any, source: Path, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InputError("must be a list of strings", file=source, key=key, fix=CACHE_FIX)
    return list(value)


def _env(value: Any, source: Path, key: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InputError("must be a table of strings", file=source, key=key, fix=CACHE_FIX)
    return {str(k): v for k, v in value.items()}


def _owned_dropped(args: list[str], model: str, dropped: list[str]) -> list[str]:
    """`args` without the flags the plan owns (and their values)."""
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value and not arg.startswith("-"):
            skip_value = False
            continue
        skip_value = False
        if arg.startswith("--") and arg_refusal(arg) is not None:
            dropped.append(f"{model}: {arg}")
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    return kept


def _recipe(entry: Any, model: str, source: Path, old: Recipe | None, dropped: list[str]) -> Recipe:
    key = f"models.{model}.recipe"
    recipe = entry.get("recipe") if isinstance(entry, dict) else None
    if not isinstance(recipe, dict):
        raise InputError("missing or not a table", file=source, key=key, fix=CACHE_FIX)
    base = recipe.get("model") or {}
    features = recipe.get("features") or {}
    amd = (recipe.get("hardware_overrides") or {}).get("amd") or {}

    def args(value: Any, where: str) -> list[str]:
        return _owned_dropped(_strings(value, source, f"{key}.{where}"), model, dropped)

    return Recipe(
        base_args=args(base.get("base_args"), "model.base_args"),
        base_env=_env(base.get("base_env"), source, f"{key}.model.base_env"),
        amd_extra_args=args(amd.get("extra_args"), "hardware_overrides.amd.extra_args"),
        amd_extra_env=_env(amd.get("extra_env"), source, f"{key}.hardware_overrides.amd"),
        tool_calling_args=args((features.get("tool_calling") or {}).get("args"), "tool_calling"),
        reasoning_args=args((features.get("reasoning") or {}).get("args"), "reasoning"),
        moe=old.moe if old else False,
        min_vllm_version=base.get("min_vllm_version"),
        docker_image=old.docker_image if old else None,
    )


def convert(
    source: Path, raw: bytes, current: InstinctRecipes
) -> tuple[InstinctRecipes, list[str]]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", file=source, fix=CACHE_FIX) from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or not models:
        raise InputError("no models table", file=source, key="models", fix=CACHE_FIX)
    for key in ("fetched_at", "docker_image"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise InputError("missing", file=source, key=key, fix=CACHE_FIX)
    dropped: list[str] = []
    recipes = {
        str(model): _recipe(entry, str(model), source, current.models.get(str(model)), dropped)
        for model, entry in sorted(models.items())
    }
    image = data["docker_image"]
    if floats(image) and not floats(current.docker_image):
        dropped.append(f"docker_image {image}: floats; kept the pinned {current.docker_image}")
        image = current.docker_image
    refreshed = InstinctRecipes(
        schema=1,
        fetched_at=data["fetched_at"],
        source=f"vllm-project/recipes via the recipe's recipes_cache.json ({source.name})",
        docker_image=image,
        generic_args=current.generic_args,
        models=recipes,
    )
    return refreshed, dropped


def serialized(recipes: InstinctRecipes) -> bytes:
    data = recipes.model_dump(mode="json", by_alias=True, exclude={"content_sha256"})
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")
