"""The validated EPYC stack: `data/epyc.json` as a checked model (docs/architecture.md, "Stack").

The pinned image and `vllm_version` form one validated stack and change together; loading
refuses a file where they disagree. Every vLLM + zentorch pair the product serves with (the
recipe's image, the embedded runtime of packaging/vllm-runtime.sh) is listed in
`data/validated-stacks.json` (`ValidatedStack`), loaded into `Stack.validated_stacks` and
checked against the image pin. It is kept out of `epyc.json`, whose bytes every plan's
fingerprint holds: the pairs judge a host vLLM's warning and name the embedded runtime's
version, and a plan records the version that serves. In a wheel the data lives at
`epycd/data/`; in the editable install it is the repository's top-level `data/`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from epycd.errors import InputError, validation_error
from epycd.readfile import TABLE_MAX_BYTES, read_bytes

STACK_FILE = "epyc.json"
VALIDATED_FILE = "validated-stacks.json"
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


class ValidatedStack(Strict):
    """One vLLM + zentorch pair the product serves with and has validated, and where it
    comes from."""

    name: Literal["image", "embedded-runtime"]
    vllm_version: str
    zentorch_version: str
    source: str = Field(description="what serves with it, for a person")

    def matches(self, vllm_version: str, zentorch_version: str | None) -> bool:
        """Its vLLM; and its zentorch, unless `zentorch_version` is None (no zentorch in use:
        the stock platform, which the route asks consent for on its own)."""
        if release(vllm_version) != self.vllm_version:
            return False
        return zentorch_version is None or release(zentorch_version) == self.zentorch_version

    def describe(self) -> str:
        return f"vLLM {self.vllm_version} with zentorch {self.zentorch_version} ({self.source})"


class ValidatedStacks(Strict):
    schema_version: int = Field(alias="schema")
    note: str = ""
    stacks: list[ValidatedStack] = Field(min_length=1)


def release(version: str) -> str:
    """A version without its local part: `0.32.0+cpu` is vLLM 0.32.0."""
    return version.split("+", 1)[0]


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
    validated_stacks: list[ValidatedStack] = Field(
        default_factory=list,
        description="from validated-stacks.json, outside content_sha256 (the fingerprint)",
    )

    @property
    def stock_image_pinned(self) -> str:
        return self.stock_image.pinned(self.vllm_version)

    def is_stock_image(self, image: str) -> bool:
        return repository_of(qualified_image(image)) == self.stock_image.repository

    @property
    def embedded_runtime(self) -> ValidatedStack:
        """The embedded runtime's pair (packaging/vllm-runtime.sh)."""
        return next(s for s in self.validated_stacks if s.name == "embedded-runtime")

    def validated_stack(
        self, vllm_version: str, zentorch_version: str | None
    ) -> ValidatedStack | None:
        """The validated pair this vLLM (and zentorch, None when none is in use) is, if any."""
        return next(
            (s for s in self.validated_stacks if s.matches(vllm_version, zentorch_version)), None
        )

    def validated_text(self) -> str:
        """Every validated pair, for a person: what a warning names."""
        return "; ".join(s.describe() for s in self.validated_stacks)

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


def validated_path(stack_file: Path | None = None) -> Path:
    """`validated-stacks.json` beside `stack_file` where there is one, else the shipped one."""
    if stack_file is not None and (stack_file.parent / VALIDATED_FILE).is_file():
        return stack_file.parent / VALIDATED_FILE
    return stack_path().parent / VALIDATED_FILE


def load_validated(path: Path) -> ValidatedStacks:
    fix = f"restore data/{VALIDATED_FILE} from the package"
    try:
        data = json.loads(read_bytes(path, TABLE_MAX_BYTES))
    except OSError as exc:
        raise InputError(f"unreadable: {exc.strerror}", file=path, fix=fix) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", file=path, fix=fix) from None
    try:
        return ValidatedStacks.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file=path, fix=fix) from None


def parse_stack(
    raw: bytes, *, source: Path | str, validated: ValidatedStacks | None = None
) -> Stack:
    """The stack in `raw` with its validated pairs (`validated`, else the shipped ones); an
    error names the file and the key when it is not valid."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not valid JSON: {exc}", file=source, fix=STACK_FIX) from None
    if not isinstance(data, dict):
        raise InputError("must be a JSON object", file=source, fix=STACK_FIX)
    data["content_sha256"] = hashlib.sha256(raw).hexdigest()
    pairs = load_validated(validated_path()) if validated is None else validated
    data["validated_stacks"] = [pair.model_dump() for pair in pairs.stacks]
    try:
        stack = Stack.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, file=source, fix=STACK_FIX) from None
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
    _check_validated(stack, source)
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


def _check_validated(stack: Stack, source: Path | str) -> None:
    """One image pair, the one `epyc.json` pins, and one embedded runtime's pair."""
    names = [pair.name for pair in stack.validated_stacks]
    image = stack.validated_stack(stack.vllm_version, stack.zentorch_version)
    if sorted(names) != ["embedded-runtime", "image"] or image is None or image.name != "image":
        raise InputError(
            f"{VALIDATED_FILE} must list the image's pair (vLLM {stack.vllm_version} with "
            f"zentorch {stack.zentorch_version}, as epyc.json pins it) and the embedded "
            "runtime's, once each",
            file=source,
            key="validated_stacks",
            fix=STACK_FIX,
        )


def load_stack(path: Path | None = None) -> Stack:
    source = path or stack_path()
    try:
        raw = read_bytes(source, TABLE_MAX_BYTES)
    except OSError as exc:
        raise InputError(f"unreadable: {exc.strerror}", file=source, fix=STACK_FIX) from None
    return parse_stack(raw, source=source, validated=load_validated(validated_path(source)))


@functools.cache
def shipped_stack() -> Stack:
    """The stack shipped with the product, read once per process."""
    return load_stack()
