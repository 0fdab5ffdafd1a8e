"""One llama-server's invocation, typed: what `llama-server` is told, as fields, and
`llama_server_argv`, the only builder of its words. The planner fills it
(`epycd.engines.llama_cpp.plan.decide`) from docs/tuning.md rule 10; the renderer emits its words.

The API key is not here: the supervisor reads the unit's credential and hands it to the
server as LLAMA_API_KEY, so it is never in a unit, an argv or a record."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

LoadMode = Literal["mmap", "mmap+mlock"]
API_KEY_ENV = "LLAMA_API_KEY"
"""llama-server reads its API key from this variable (its `--api-key`'s env)."""


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
    cache_ram_mib: int = Field(description="--cache-ram: the prompt cache's RAM, 0 for none")
    load_mode: LoadMode
    chat_template_file: str | None = None


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
    if invocation.chat_template_file:
        argv += ["--jinja", "--chat-template-file", invocation.chat_template_file]
    return argv
