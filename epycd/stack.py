"""The validated EPYC stack: `data/epyc.json` as a checked model (docs/architecture.md, "Stack").

The pinned image and `vllm_version` form one validated stack and change together; loading
refuses a file where they disagree. In a wheel the data lives at `epycd/data/`; in the
editable install it is the repository's top-level `data/`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from epycd.errors import InputError

STACK_FILE = "epyc.json"
STACK_FIX = "restore data/epyc.json from the package (image tag and vllm_version change together)"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StockImage(Strict):
    repository: str
    pinned_tag: str = Field(description="tag template, {version} is a vLLM version")
    latest_tag: str
    entrypoint_is_vllm_serve: bool
    verified_on: str

    def pinned(self, version: str) -> str:
        return f"{self.repository}:{self.pinned_tag.format(version=version)}"


class EnvRules(Strict):
    set_by_plan: list[str]
    never_set: list[str]
    secrets: list[str]


class StackDefaults(Strict):
    max_model_len: int = Field(gt=0)
    first_port: int = Field(gt=0, lt=65536)
    busy_threshold_pct: float = Field(gt=0, le=100)


class StartTimeout(Strict):
    base_s: int = Field(gt=0)
    per_weights_gib_s: int = Field(ge=0)


class GatedFamily(Strict):
    family: str
    prefixes: list[str]
    needs: str


class Stack(Strict):
    schema_version: int = Field(alias="schema")
    vllm_version: str
    zentorch_version: str
    image: str
    image_entrypoint_is_vllm_serve: bool
    stock_image: StockImage
    validated_generations: list[str]
    zen_platform_marker: str
    run_flags: list[str]
    isolated_ipc_shm_size: str
    env: EnvRules
    throughput_flags: dict[str, str]
    throughput_note: str
    never_args: dict[str, str]
    precisions: list[str]
    default_dtype: str
    kv_cache_dtype_note: str
    headroom_gb: float
    default_model: str
    defaults: StackDefaults
    start_timeout: StartTimeout
    gated_families: list[GatedFamily]
    content_sha256: str = Field(default="", description="sha256 of the file's bytes")

    @property
    def stock_image_pinned(self) -> str:
        return self.stock_image.pinned(self.vllm_version)

    def is_stock_image(self, image: str) -> bool:
        return repository_of(qualified_image(image)) == self.stock_image.repository

    def gated_family(self, model: str) -> GatedFamily | None:
        for family in self.gated_families:
            if any(model.startswith(prefix) for prefix in family.prefixes):
                return family
        return None


def qualified_image(image: str) -> str:
    """Docker's rule for a short name: no registry host in front means Docker Hub
    (`docker.io/`, plus `library/` for a bare name). Quadlet warns about short names."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if sep else f"docker.io/library/{image}"


def repository_of(image: str) -> str:
    """The image without its tag or digest."""
    name = image.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def stack_path() -> Path:
    """The shipped `epyc.json`: the wheel's `epycd/data/`, else the repository's `data/`."""
    packaged = resources.files("epycd").joinpath("data", STACK_FILE)
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "data" / STACK_FILE


def parse_stack(raw: bytes, *, source: Path | str) -> Stack:
    """The stack in `raw`; an error names the file and the key when it is not valid."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", file=source, fix=STACK_FIX) from None
    if not isinstance(data, dict):
        raise InputError("must be a JSON object", file=source, fix=STACK_FIX)
    data["content_sha256"] = hashlib.sha256(raw).hexdigest()
    try:
        stack = Stack.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise InputError(first["msg"], file=source, key=key, fix=STACK_FIX) from None
    _check_consistent(stack, source)
    return stack


def _check_consistent(stack: Stack, source: Path | str) -> None:
    expected = f"vllm_v{stack.vllm_version}_zentorch_v{stack.zentorch_version}"
    tag = stack.image.rsplit(":", 1)[-1]
    if ":" not in stack.image or not tag.startswith(expected):
        raise InputError(
            f"image tag {tag!r} does not match vllm_version {stack.vllm_version} and "
            f"zentorch_version {stack.zentorch_version} (expected a tag starting {expected!r})",
            file=source,
            key="image",
            fix=STACK_FIX,
        )
    if stack.default_dtype not in stack.precisions:
        raise InputError(
            f"default_dtype {stack.default_dtype!r} is not one of precisions",
            file=source,
            key="default_dtype",
            fix=STACK_FIX,
        )
    if len(stack.throughput_flags) != 3:
        raise InputError(
            "the throughput set is three flags set together",
            file=source,
            key="throughput_flags",
            fix=STACK_FIX,
        )


def load_stack(path: Path | None = None) -> Stack:
    source = path or stack_path()
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise InputError(f"unreadable: {exc.strerror}", file=source, fix=STACK_FIX) from None
    return parse_stack(raw, source=source)


@functools.cache
def shipped_stack() -> Stack:
    """The stack shipped with the product, read once per process."""
    return load_stack()
