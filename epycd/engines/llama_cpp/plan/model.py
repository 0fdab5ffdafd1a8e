"""What a llama.cpp server's decisions are (`SERVERS`): one llama-server on CPUs
(`LlamaServer`: an endpoint's only server, or one of a set's), with what the servers of
an endpoint share (`LlamaService`); and the types they are made of: the route
(`LlamaRoute`: llama-server on the host, the runtime's or the file's), the fit in one
socket (`LlamaFit`, docs/tuning.md rule 9) and the invocation, typed (`LlamaInvocation`),
with `llama_server_argv`, the only builder of its words; the renderer emits them.

The API key is not in the invocation: the supervisor reads the unit's credential and hands it
to the server as LLAMA_API_KEY, so it is never in a unit, an argv or a record."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from epycd.engines.llama_cpp.model.memory import LlamaMemory
from epycd.plan.invocation_facts import InvocationFacts
from epycd.plan.model import CpuServer, HostService, ServerFit
from epycd.plan.route import EngineRoute
from epycd.sizes import gib

LoadMode = Literal["mmap", "mmap+mlock"]
API_KEY_ENV = "LLAMA_API_KEY"
"""llama-server reads its API key from this variable (its `--api-key`'s env)."""


SPECULATIVE_TYPES = {"ngram": "ngram-mod"}
"""llama-server's --spec-type for each `speculative` value: ngram-mod drafted and won where
its other n-gram types drafted nothing or less (benchmarks/speculative-results.md)."""
POOLING_FLAGS = {"embedding": "--embeddings", "rerank": "--rerank"}
"""llama-server's flag for each kind of pooling model it serves (its --help: the file's own
pooling type is used unless --pooling says otherwise)."""


def pooling_served(primary_endpoint: str | None) -> Literal["embedding", "rerank"] | None:
    """The kind of pooling model llama-server serves on an endpoint's path; None for a
    generator's."""
    if primary_endpoint == "embeddings":
        return "embedding"
    return "rerank" if primary_endpoint == "rerank" else None


class LlamaInvocation(BaseModel):
    """`llama-server` of one endpoint: the GGUF file, where it listens and as what, its
    threads, slots and KV pool, how it loads the weights and what else it keeps in RAM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str = Field(description="the GGUF file, resolved on the host")
    alias: str = Field(description="--alias: the id /v1/models lists")
    host: str
    port: int
    threads: int = Field(description="-t and -tb: the endpoint's cores, one thread each")
    slots: int = Field(description="--parallel: requests served at once")
    context: int = Field(
        description="--ctx-size: the KV pool the slots share (--kv-unified), and so the most "
        "tokens one request may hold"
    )
    ubatch: int = Field(description="-ub: tokens per compute step, which sizes the buffer")
    pooling: Literal["embedding", "rerank"] | None = Field(
        default=None,
        description="--embeddings or --rerank: an embedder's or a reranker's endpoint, whose "
        "input is read whole in one step (-b and -ub: the context)",
    )
    cache_ram_mib: int = Field(description="--cache-ram: the prompt cache's RAM, 0 for none")
    load_mode: LoadMode
    chat_template_file: str | None = None
    speculative: Literal["ngram"] | None = Field(
        default=None,
        description="--spec-type ngram-mod: the endpoint file's `speculative`; left out of a "
        "record when None, so that the records of every other endpoint are as they were",
        exclude_if=lambda value: value is None,
    )


def llama_server_argv(invocation: LlamaInvocation) -> list[str]:
    """The words after the executable. `--fit off`: the plan sized the context and slots,
    llama-server must not shrink them; `--no-ui` and `--no-slots`: no web page and no view of
    other users' prompts on an API endpoint; `--metrics`: the watchdog's and epycd's reading
    of its progress."""
    argv = [
        "--model",
        invocation.model_path,
        "--alias",
        invocation.alias,
        "--host",
        invocation.host,
        "--port",
        str(invocation.port),
        "--threads",
        str(invocation.threads),
        "--threads-batch",
        str(invocation.threads),
        "--parallel",
        str(invocation.slots),
        "--ctx-size",
        str(invocation.context),
        "--kv-unified",
        "--ubatch-size",
        str(invocation.ubatch),
        "--cache-ram",
        str(invocation.cache_ram_mib),
        "--load-mode",
        invocation.load_mode,
        "--fit",
        "off",
        "--metrics",
        "--no-ui",
        "--no-slots",
    ]
    if invocation.pooling is not None:
        argv += [POOLING_FLAGS[invocation.pooling], "--batch-size", str(invocation.ubatch)]
    if invocation.chat_template_file:
        argv += ["--jinja", "--chat-template-file", invocation.chat_template_file]
    if invocation.speculative is not None:
        argv += ["--spec-type", SPECULATIVE_TYPES[invocation.speculative]]
    return argv


class LlamaFit(BaseModel):
    """A llama.cpp endpoint's fit in one socket, GiB where not said otherwise."""

    context: int = Field(description="tokens per slot, or of the one pool the slots share")
    slots: int
    memory: LlamaMemory
    process_gb: float = Field(description="the server process at its peak")
    headroom_gb: float = Field(description="the OS's share, apart from the server (rule 3)")
    required_gb: float = Field(description="process_gb + headroom_gb")
    available_gb: float
    fits: bool
    suggested_context: int | None = Field(
        description="where it does not fit: the most tokens (per slot, or of the shared pool) "
        "that do, a multiple of 256"
    )
    action: str


class LlamaRoute(EngineRoute):
    """llama-server on the host, the runtime's or the file's."""

    engine: Literal["llama.cpp"] = "llama.cpp"
    runtime: Literal["host"] = "host"
    llama_server: str
    llama_version: str

    def json_keys(self) -> dict[str, Any]:
        """Its keys of `plan --json` (its vLLM keys stay null)."""
        return super().json_keys() | {
            "engine": self.engine,
            "llama_server": self.llama_server,
            "llama_version": self.llama_version,
        }

    def path_row(self) -> tuple[str, str]:
        return ("Path", f"host llama-server ({self.llama_server})")


class LlamaService(HostService):
    """What a llama.cpp endpoint (one server or a set) has beside every endpoint's fields:
    which llama-server serves which GGUF file."""

    model_config = ConfigDict(frozen=True)

    engine: Literal["llama.cpp"] = "llama.cpp"
    llama_server: str = Field(description="the llama-server executable")
    llama_version: str = Field(description="the llama.cpp source it was built from")
    gguf_file: str = Field(description="the GGUF file's name, as the endpoint file gives it")


class LlamaServer(InvocationFacts, CpuServer, LlamaService):
    """One llama-server on CPUs, an endpoint's only server or one of a set's:
    a GGUF file, pinned to one socket's cores and NUMA nodes as a vLLM instance is, sized by
    docs/tuning.md rules 9-10."""

    invocation_type: ClassVar[type[BaseModel]] = LlamaInvocation

    kind: Literal["llama"] = "llama"
    set_kind: ClassVar[str] = "llama-set"
    env: dict[str, str] = Field(
        default_factory=dict, description="llama-server's environment; never a secret"
    )
    fit: LlamaFit = Field(description="the fit of the process in the NUMA nodes' RAM")
    invocation: LlamaInvocation = Field(
        description="the server typed; its words (`server_args`) are made when read, never stored"
    )

    @classmethod
    def nested_invocation_facts(cls, invocation: LlamaInvocation) -> dict[str, dict[str, Any]]:
        """Its fit was computed at the invocation's context and slots."""
        return {"fit": {"context": invocation.context, "slots": invocation.slots}}

    @property
    def server_args(self) -> list[str]:
        """The arguments after llama-server: the invocation's words."""
        return llama_server_argv(self.invocation)

    @property
    def cpu_fit(self) -> ServerFit:
        return self.fit

    @property
    def omp_cpus(self) -> str:
        """The cores its threads run on: all of its pinned set."""
        return self.cpus

    @property
    def kv_cache_gb(self) -> float:
        """The KV pool the slots share, GiB."""
        return gib(self.fit.memory.kv_bytes)

    @property
    def max_model_len(self) -> int:
        return self.invocation.context

    @property
    def max_num_seqs(self) -> int:
        return self.invocation.slots


SERVERS = (LlamaServer,)
