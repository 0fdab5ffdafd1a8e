"""The Instinct GPU recipe's data, vendored: `data/instinct-gpus.json` (products per gfx
target, per-gfx env overrides, the container's devices and flags, the VRAM fit tiers, the
models that are not LLM endpoints) and `data/instinct-recipes.json` (per-model vLLM args and
env, dated by `fetched_at`; `epycctl instinct-recipes --from FILE` refreshes it offline from
the recipe's `recipes_cache.json`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from epycd.errors import InputError, validation_error
from epycd.readfile import TABLE_MAX_BYTES, read_bytes

GPUS_FILE = "instinct-gpus.json"
RECIPES_FILE = "instinct-recipes.json"
ModelT = TypeVar("ModelT", bound=BaseModel)
DATA_FIX = "restore the file from the package, or refresh it: epycctl instinct-recipes --from FILE"


class GpuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    env_defaults: dict[str, str] = {}
    workarounds: list[str] = []
    precision_native: list[str] = []


class FitTiers(BaseModel):
    """The recipe's VRAM fit, per GPU: weights / TP + overhead, then what is left for KV."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    overhead_gb: float
    safe_kv_gb: float
    min_kv_gb: float


class NotAnLlm(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str
    alternative: str


class InstinctGpus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: int = Field(alias="schema")
    source: str
    validated_gfx: list[str]
    unvalidated_note: str
    products: dict[str, dict[str, str]]
    gpu_configs: dict[str, GpuConfig]
    docker_flags: list[str]
    devices: list[str]
    groups: list[str]
    fit: FitTiers
    tensor_parallel_sizes: list[int]
    not_llm_endpoints: dict[str, NotAnLlm]
    content_sha256: str = ""


class Recipe(BaseModel):
    """One model's recipe: `model.base_args`/`base_env`, the AMD overrides, the feature args."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_args: list[str] = []
    base_env: dict[str, str] = {}
    amd_extra_args: list[str] = []
    amd_extra_env: dict[str, str] = {}
    tool_calling_args: list[str] = []
    reasoning_args: list[str] = []
    moe: bool = False
    min_vllm_version: str | None = None
    docker_image: str | None = None


class InstinctRecipes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: int = Field(default=1, alias="schema")
    fetched_at: str
    source: str
    docker_image: str
    generic_args: list[str]
    models: dict[str, Recipe]
    content_sha256: str = ""


def floats(image: str) -> bool:
    """An image reference a later pull can change: no tag, or `:latest` (a digest pins)."""
    if "@" in image:
        return False
    name = image.rsplit("/", 1)[-1]
    return ":" not in name or name.rsplit(":", 1)[1] == "latest"


def data_path(name: str) -> Path:
    """A shipped data file: the wheel's `epycd/data/`, else the repository's `data/`."""
    packaged = resources.files("epycd").joinpath("data", name)
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent.parent / "data" / name


def _load(kind: type[ModelT], path: Path) -> ModelT:
    try:
        raw = read_bytes(path, TABLE_MAX_BYTES)
        data = json.loads(raw)
    except OSError as exc:
        raise InputError(f"unreadable: {exc.strerror}", file=path, fix=DATA_FIX) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", file=path, fix=DATA_FIX) from None
    if not isinstance(data, dict):
        raise InputError("must be a JSON object", file=path, fix=DATA_FIX)
    data["content_sha256"] = hashlib.sha256(raw).hexdigest()
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file=path, fix=DATA_FIX) from None


@functools.cache
def shipped_gpus() -> InstinctGpus:
    return _load(InstinctGpus, data_path(GPUS_FILE))


@functools.cache
def shipped_recipes() -> InstinctRecipes:
    return _load(InstinctRecipes, data_path(RECIPES_FILE))


def load_recipes(path: Path) -> InstinctRecipes:
    return _load(InstinctRecipes, path)


def product_name(gfx: str, vram_gib: float) -> str:
    """The product of a gfx target, told apart by VRAM (gfx942: MI300A/MI300X/MI325X)."""
    products = shipped_gpus().products.get(gfx)
    if not products:
        return f"AMD GPU ({gfx})"
    nearest = min(products, key=lambda size: abs(float(size) - vram_gib))
    return "AMD Instinct " + products[nearest]


DATED_SUFFIX = re.compile(r"-(\d{4}|\d{6}|\d{8}|v\d+(\.\d+)*)$")


def recipe_for(model: str, recipes: InstinctRecipes) -> tuple[str, Recipe] | None:
    """The recipe of `model`, or of its base model without a date or version suffix
    (Kimi-K2-Instruct-0905 uses Kimi-K2-Instruct's), as the recipe says."""
    if model in recipes.models:
        return model, recipes.models[model]
    base = DATED_SUFFIX.sub("", model)
    if base != model and base in recipes.models:
        return base, recipes.models[base]
    return None
