"""What every engine tells the core about the server it runs (`Engine`): how its /health
reads while it loads, the metrics its /metrics exports, and the variable its API key
reaches it in. One module per engine implements it (epycd.engines.vllm,
epycd.engines.llama_cpp) and the registry (epycd.engines) lists them; the core asks the
engine and never names one. docs/adding-an-engine.md says how to add one."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, TypeVar, cast

import httpx

T = TypeVar("T")
M = TypeVar("M")

RUNTIMES = ("podman", "docker", "host")
"""Every runtime a server may run in: a Quadlet container, a docker container, the host."""


@dataclass(frozen=True)
class ServerMetrics:
    """The names in a server's Prometheus exposition that epycd reads or forwards."""

    prefix: str
    """Every family of the engine's own starts with it (forwarded by epycd.metrics.scrape)."""
    running: str
    """A gauge of the requests being computed now (the stall watch and `status`)."""
    waiting: str
    """A gauge of the requests queued."""
    tokens: tuple[str, ...]
    """The counters of prompt and generated tokens; their sum grows while it works."""
    kv_usage: str | None = None
    """A gauge of the KV cache's use, 0 to 1; None where the engine exports none."""

    @property
    def load(self) -> tuple[str, ...]:
        """Every name `status` reads for the last minute's load."""
        kv = (self.kv_usage,) if self.kv_usage else ()
        return (self.running, self.waiting, *kv, *self.tokens)


@dataclass(frozen=True)
class Engine:
    """One engine, as the running side of epycd sees it."""

    name: str
    """The endpoint file's `engine = "..."` and `plan --json`'s `engine`."""
    package: str
    """The engine's package (`__name__` of its `__init__`): each stage finds the engine's
    implementation of it there by name (`implementation`), so no stage imports an engine."""
    title: str
    """The engine's name in text for people (a balancer's Description)."""
    server: str
    """The server's name in messages ("vLLM", "llama-server")."""
    serves: str
    """What it serves and where it comes from, for the help of `quickstart --engine`."""
    metrics: ServerMetrics
    api_key_env: str
    """The variable the server reads its API key from; the key never is in its argv."""
    loading_health: dict[str, Any] | None = None
    """The JSON `error` of the 503 its /health answers while it loads the model; None for a
    server that does not listen until it is ready."""
    runtimes: tuple[str, ...] = RUNTIMES
    """The runtimes its servers can run in (an endpoint file's `runtime`, "auto" aside)."""
    runtimes_reason: str = ""
    """Why it runs in those alone, for the error of an endpoint file that asks for another."""
    cache_variables: tuple[tuple[str, str], ...] = ()
    """The variables that move what the server compiles and caches, each with its folder in
    the endpoint's own cache directory (a unit sets them unless the endpoint file does)."""
    model_format: str | None = None
    """The model format it reads ("safetensors": Hugging Face models; "gguf"), implemented as
    `FORMAT` in its package's `model/format.py` (`epycd.model.formats`); None for an engine
    that serves models of another engine's format."""
    no_kube_export: str | None = None
    """Why `epycctl export` cannot write its endpoints as Kubernetes objects; None where it
    can."""
    commands: tuple[str, ...] = ()
    """The `epycctl` commands of its own (`epycctl convert`: llama.cpp's converter): each NAME
    is `NAME_command` (dashes as underscores) in its package's `commands.py`, listed beside
    epycctl's own."""

    def implementation(
        self, module: str, name: str, kind: Callable[..., T], default: T | None = None
    ) -> T:
        """The engine's implementation of one stage: `name` in its package's `module`
        ("plan.planner", "PLANNER"), as mkosi's distributions find their installers. The
        module is imported on first use, so a stage's registry never imports an engine and an
        engine's own stage modules may import that stage freely. `kind` is the stage's base
        class (a callable to the type checker, which refuses an abstract class as a type);
        `default` is the core's own, for a stage an engine may leave to it, in a module it
        need not have."""
        path = f"{self.package}.{module}"
        try:
            imported = import_module(path)
        except ModuleNotFoundError as missing:
            if default is None or missing.name != path:
                raise
            return default
        found = getattr(imported, name, default)
        base = cast(type, kind)
        if not isinstance(found, base):
            raise TypeError(f"{path}.{name} is no {base.__name__}")
        return cast(T, found)

    def still_loading(self, response: httpx.Response) -> bool:
        """Whether `response` is this server's /health saying it still loads the model."""
        if self.loading_health is None or response.status_code != 503:
            return False
        try:
            return bool(response.json().get("error") == self.loading_health)
        except (ValueError, AttributeError):
            return False


def extended(base: type[M], parts: Iterable[type]) -> type[M]:
    """`base` (a pydantic model) with the engines' models of their own fields mixed in (their
    endpoint-file keys, their settings), under `base`'s name; `base` itself where no engine
    has any."""
    bases = (base, *parts)
    if len(bases) == 1:
        return base
    return cast(type[M], type(base.__name__, bases, {"__module__": base.__module__}))
