"""llama.cpp's own memory accounting for a GGUF file at a llama-server's settings: the pinned
runtime's combined binary, `llama fit-params`, read with a bound (docs/tuning.md rule 9).

`llama fit-params` loads the file's metadata and reserves every buffer without allocating
(no weight is read: 0.5-0.9 s for a 235 MiB model), then prints a table on stderr, one row per
buffer type, in whole MiB rounded down (each line after `I common_memory_breakdown_print:`):

    | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
    |   - Host               |                  809 =   222 +      72 +     514                |
    |   - CPU_REPACK         |                   12 =    12 +       0 +       0                |

`Host`'s model is the mapped weights less what another buffer type holds (`CPU_REPACK`: the
CPU backend's repacked copy), context the KV cache, compute the graph's buffer. The output
buffer is in no column. Exit 1 with the table printed means the settings do not fit this
machine's free memory, which is the plan's question on its own nodes, not this reader's; exit 1
without it means llama.cpp could not load the file, and its reason is on an `E` line when its
log got out (often it does not: rule 9).

`fit-params` is not the plan's figure: it takes no `--kv-unified` and reserves logits for every
token of a ubatch, where llama-server reserves one output per slot (rule 9 measures both). The
plan's figure is llama-server's own pass (`llama_server_memory`): the plan's exact words with
`--fit on --fit-target 0`, which reserves the same buffers before loading the weights and
prints the same table; the server is asked only that and killed at the pass's end line, before
it reads a weight or binds its port (0.7 s for Gemma 3 270M).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from epycd.childproc import run_bounded
from epycd.engines.llama_cpp.model.memory import LlamaMemory, output_bytes, padded_cells
from epycd.engines.llama_cpp.plan.model import LlamaInvocation, LoadMode, llama_server_argv
from epycd.errors import Refusal
from epycd.model.facts import GgufFile

MIB = 1024**2
FIT_TIMEOUT_S = 120.0
"""Metadata only, no weight read: 0.6 s for Gemma 3 270M on a 2-core VM; a 100-GB file's
thousands of tensors are still seconds. The bound is for a binary that hangs."""
FIT_MAX_BYTES = 256 * 1024
"""At `-lv 4` the answer is about 1 KB (a few more lines on an error)."""
LOG_VERBOSITY = "4"
"""`-lv 4` prints the table and its verdict; 3 (the default) prints neither, `-v` every tensor
and graph node as well (170 KB for a 235 MiB model, more with the tensors)."""
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
"""`-ctk`/`-ctv`'s values (`llama fit-params --help`)."""
HOST_ROW = "Host"
UNSAID_ATTEMPTS = 12
"""A file llama.cpp cannot load fails in milliseconds, but about half the time its reason is
lost (the log's thread is not flushed before exit 1; 20 of 40 runs): 12 asks leave 1 in 4096."""

_ROW = re.compile(
    r"\|\s+-\s+(?P<name>\S.*?)\s+\|\s+(?:\d+\s+\d+\s+)?(?P<self>\d+)\s+=\s+(?P<model>\d+)"
    r"\s+\+\s+(?P<context>\d+)\s+\+\s+(?P<compute>\d+)\s+(?:\d+\s+)?\|\s*$"
)
_TERMS = ("self", "model", "context", "compute")
_TABLE = "memory breakdown [MiB]"
_ERROR = re.compile(r"^\S+\s+E\s+(?P<text>.*\S)\s*$")
_USELESS_ERRORS = (
    "failed to load model",
    "encountered an error while trying to fit params",
    "failed to fit CLI arguments",
    "exiting due to model loading error",
)
"""The `E` lines that follow the reason and say nothing of it."""


class FitSettings(BaseModel):
    """What llama-server will run with, as far as `llama fit-params` takes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: int = Field(gt=0, description="-c: the context (KV cells of every slot)")
    slots: int = Field(gt=0, description="-np: parallel sequences")
    ubatch: int = Field(default=512, gt=0, description="-ub: tokens per compute step")
    batch: int = Field(default=2048, gt=0, description="-b: the logical batch")
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    threads: int = Field(default=1, gt=0, description="-t and -tb")
    load_mode: Literal["mmap", "mmap+mlock", "none"] = "mmap"
    repack: bool = Field(default=True, description="--repack, or --no-repack")


class FitRow(BaseModel):
    """One buffer type's row of the table, bytes (whole MiB, rounded down by llama.cpp)."""

    model_config = ConfigDict(frozen=True)

    name: str
    self_bytes: int
    model_bytes: int
    context_bytes: int
    compute_bytes: int


class LlamaCppMemory(BaseModel):
    """llama.cpp's table for one file at one setting, by what holds the bytes. Each term is
    what llama.cpp printed, so up to 1 MiB (`RESOLUTION_BYTES`) below the buffer itself."""

    model_config = ConfigDict(frozen=True)

    weights_bytes: int = Field(description="Host's model: the mapped weights not repacked")
    repacked_bytes: int = Field(description="the other buffer types' model (CPU_REPACK)")
    context_bytes: int = Field(description="the KV cache (and a recurrent model's state)")
    compute_bytes: int = Field(description="the graph's buffer for the worst ubatch")
    rows: tuple[FitRow, ...]
    fits_free_memory: bool | None = Field(
        description="llama.cpp's own verdict against this machine's free memory (exit 0 of "
        "fit-params); None from llama-server's pass, which is not asked"
    )

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.repacked_bytes + self.context_bytes + self.compute_bytes


RESOLUTION_BYTES = MIB


def fit_params_argv(llama: str, model: str, settings: FitSettings) -> list[str]:
    """`llama fit-params` at `settings`, its table at `-lv 4`; `--fit-target 0`: exit 0 means
    the settings fit all the machine's free memory (the plan decides on its nodes)."""
    threads = str(settings.threads)
    return [
        llama, "fit-params", "--model", model,
        "--ctx-size", str(settings.context), "--parallel", str(settings.slots),
        "--batch-size", str(settings.batch), "--ubatch-size", str(settings.ubatch),
        "--cache-type-k", settings.cache_type_k, "--cache-type-v", settings.cache_type_v,
        "--threads", threads, "--threads-batch", threads,
        "--load-mode", settings.load_mode, "--repack" if settings.repack else "--no-repack",
        "--fit-target", "0", "--log-verbosity", LOG_VERBOSITY,
    ]  # fmt: skip


def combined_binary(llama_server: str) -> str:
    """The runtime's `llama` beside its `llama-server` (packaging/llama-runtime.sh installs
    both in bin/)."""
    return str(Path(llama_server).with_name("llama"))


def llama_cpp_memory(llama: str, model: Path, settings: FitSettings) -> LlamaCppMemory:
    """llama.cpp's table for `model` at `settings`, or a Refusal naming the file and
    llama.cpp's reason."""
    argv = fit_params_argv(llama, str(model), settings)
    for _ in range(UNSAID_ATTEMPTS):
        done = _run(argv, model, "fit-params")
        said = done.returncode == 0 or parse_breakdown(done.stderr) or fit_reason(done.stderr)
        if said:
            break
    return read_fit_params(model, done.returncode, done.stderr)


def _run(
    argv: list[str], model: Path, asked: str, until: Callable[[bytearray], bool] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return run_bounded(
            argv,
            timeout=FIT_TIMEOUT_S,
            max_bytes=FIT_MAX_BYTES,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            until=until,
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise _unknown(model, f"`{Path(argv[0]).name} {asked}` did not answer: {error}") from None


SERVER_FIT_DONE = "common_fit_params: fitting params to free memory took"
"""The line llama-server's `--fit on` pass ends with, the table printed before it."""


def server_fit_argv(llama_server: str, server_words: Sequence[str]) -> list[str]:
    """llama-server with the plan's words (`llama_server_argv`), its `--fit off` turned on with
    no margin (the pass then changes nothing that fits) and its log at the table's level."""
    words = list(server_words)
    if "--fit" not in words[:-1]:
        raise ValueError("the plan's llama-server words have no --fit")
    at = words.index("--fit")
    words[at : at + 2] = ["--fit", "on", "--fit-target", "0"]
    return [llama_server, *words, "--log-verbosity", LOG_VERBOSITY]


def _fit_done(stderr: bytearray) -> bool:
    return SERVER_FIT_DONE.encode() in stderr


def llama_server_memory(
    llama_server: str, model: Path, server_words: Sequence[str]
) -> LlamaCppMemory:
    """llama-server's own table for the plan's exact words, or a Refusal naming the file and
    llama.cpp's reason."""
    argv = server_fit_argv(llama_server, server_words)
    for _ in range(UNSAID_ATTEMPTS):
        done = _run(argv, model, "--fit on", until=_fit_done)
        refuse_unknown_words(llama_server, done.stderr)
        if _finished(done.returncode, done.stderr, server_pass=True) or fit_reason(done.stderr):
            break  # else it exited before its log got out: ask again
    return read_fit_params(model, done.returncode, done.stderr, server_pass=True)


_INVALID_ARGUMENT = re.compile(r"^error: invalid argument: (?P<word>\S+)", re.MULTILINE)
"""llama.cpp's argument parser on a word its build does not know (common/arg.cpp)."""


def refuse_unknown_words(llama_server: str, stderr: str) -> None:
    """A llama-server older than the words the plan gives it (`--fit` came with the pinned
    llama.cpp's generation): the server is what to change, not the model."""
    unknown = _INVALID_ARGUMENT.search(stderr)
    if unknown:
        raise Refusal(
            f"llama-server {llama_server} does not take {unknown['word']}, which the plan gives "
            "it: it is older than the llama.cpp the plan is made for",
            file=Path(llama_server),
            key="llama_server",
            fix="remove llama_server to use the llama.cpp runtime's, or name a llama-server "
            "built from a llama.cpp that takes --fit",
        )


def _finished(returncode: int, stderr: str, *, server_pass: bool) -> bool:
    """It said all it would: fit-params exited 0, or the server's pass reached its end."""
    return returncode == 0 or (server_pass and SERVER_FIT_DONE in stderr)


def read_fit_params(
    model: Path, returncode: int, stderr: str, *, server_pass: bool = False
) -> LlamaCppMemory:
    """The table in `llama fit-params`'s stderr (its last: its verdict on free memory), or in
    llama-server's pass (`server_pass`: its first, at the settings asked; no verdict), or a
    Refusal with llama.cpp's reason."""
    rows = parse_breakdown(stderr, "first" if server_pass else "last")
    if not rows:
        reason = fit_reason(stderr) or (
            "it printed no memory breakdown"
            if _finished(returncode, stderr, server_pass=server_pass)
            else fit_error(stderr)
        )
        raise _unknown(model, reason)
    if not any(row.name == HOST_ROW for row in rows):
        raise _unknown(model, f"its memory breakdown has no {HOST_ROW} row")
    others = [row for row in rows if row.name != HOST_ROW]
    host = next(row for row in rows if row.name == HOST_ROW)
    return LlamaCppMemory(
        weights_bytes=host.model_bytes,
        repacked_bytes=sum(row.model_bytes for row in others),
        context_bytes=sum(row.context_bytes for row in rows),
        compute_bytes=sum(row.compute_bytes for row in rows),
        rows=tuple(rows),
        fits_free_memory=None if server_pass else returncode == 0,
    )


def parse_breakdown(log: str, table: Literal["first", "last"] = "last") -> list[FitRow]:
    """The rows of the last (or first) memory breakdown table in `log` (llama-server's
    `--fit on` pass prints the same table; its first is at the settings asked)."""
    rows: list[FitRow] = []
    for line in log.splitlines():
        if _TABLE in line:
            if rows and table == "first":
                break
            rows = []
            continue
        match = _ROW.search(line)
        if match:
            rows.append(
                FitRow(
                    name=match["name"],
                    **{f"{term}_bytes": int(match[term]) * MIB for term in _TERMS},
                )
            )
    return rows


def fit_reason(log: str) -> str | None:
    """llama.cpp's reason for not loading a file: its first telling `E` line."""
    errors = [match["text"] for match in map(_ERROR.match, log.splitlines()) if match]
    telling = [text for text in errors if not any(skip in text for skip in _USELESS_ERRORS)]
    return telling[0] if telling else None


def fit_error(log: str) -> str:
    """llama.cpp's reason, else what is known."""
    return fit_reason(log) or (
        f"llama.cpp could not load it and printed no reason ({UNSAID_ATTEMPTS} times: its "
        "log is lost on this failure more often than not)"
    )


def _unknown(model: Path, reason: str) -> Refusal:
    return Refusal(
        f"llama.cpp cannot say the memory of serving {model.name}: {reason}",
        file=model,
        key="model",
        fix="serve a GGUF file the pinned llama.cpp loads (`epycctl check-model FILE`)",
    )


PROBES_KEPT = 64
"""llama-server's answers kept in the process (a plan asks up to four contexts per endpoint;
epycd plans again at each reconcile, and the answer stands while the file and words do)."""


FileIdentity = tuple[int, int, int]
"""A file's inode, size and mtime: a changed file is a new question."""


@functools.lru_cache(maxsize=PROBES_KEPT)
def _server_memory_of(
    llama_server: str,
    server: FileIdentity,
    model: Path,
    identity: FileIdentity,
    words: tuple[str, ...],
) -> LlamaCppMemory | Refusal:
    """The answer, or the refusal, kept alike: a file llama.cpp cannot load (or a server
    that does not answer, up to FIT_TIMEOUT_S) is not asked again at each reconcile while
    neither the file nor the server changed."""
    try:
        return llama_server_memory(llama_server, model, words)
    except Refusal as refused:
        return refused


def server_memory(llama_server: str, model: Path, words: Sequence[str]) -> LlamaCppMemory:
    """`llama_server_memory`, asked once per state of the file and of the server, and words."""
    try:
        server = _identity(Path(llama_server))
    except OSError:
        server = (0, 0, 0)  # `_run` says what became of it
    try:
        identity = _identity(model)
    except OSError as error:
        raise _unknown(model, f"it cannot be read: {error.strerror or error}") from None
    told = _server_memory_of(llama_server, server, model, identity, tuple(words))
    if isinstance(told, Refusal):
        raise told
    return told


def _identity(path: Path) -> FileIdentity:
    stat = path.stat()
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def as_plan_memory(
    told: LlamaCppMemory, gguf: GgufFile, *, cells: int, slots: int, ubatch: int,
    embeddings: bool,
) -> LlamaMemory:  # fmt: skip
    """llama.cpp's table as the plan's terms: the weights the whole file maps (its tensors'
    bytes, exact), each buffer llama.cpp printed rounded down raised by its resolution (the
    plan errs above), and the output buffer, in no column, by its exact rule. The `Host` row's
    KV and compute are raised even where they print 0 (a 0.5 MiB KV cache prints 0; an
    encoder's absent one costs the plan 1 MiB); another row's only where it holds some."""
    host = next(row for row in told.rows if row.name == HOST_ROW)
    others = [row for row in told.rows if row.name != HOST_ROW]
    return LlamaMemory(
        cells=cells,
        slots=slots,
        ubatch=ubatch,
        weights_bytes=gguf.tensors_bytes,
        repacked_bytes=_raised(row.model_bytes for row in others),
        kv_bytes=_raised(
            [host.context_bytes, *(r.context_bytes for r in others if r.context_bytes)]
        ),
        compute_bytes=_raised(
            [host.compute_bytes, *(r.compute_bytes for r in others if r.compute_bytes)]
        ),
        output_bytes=output_bytes(gguf.vocab_size or 0, gguf.embedding_length, slots, embeddings),
        source="llama.cpp",
    )


def _raised(printed: Iterable[int]) -> int:
    """What printed figures hold at most: each up to its resolution above what it says."""
    return sum(figure + RESOLUTION_BYTES for figure in printed)


def fit_words_at(
    model_path: str,
    *,
    threads: int,
    slots: int,
    ubatch: int,
    pooling: Literal["embedding", "rerank"] | None,
    load_mode: LoadMode,
    speculative: Literal["ngram"] | None = None,
) -> Callable[[int], list[str]]:
    """The words of a llama-server asked only its memory at `cells`: the plan's own
    (`llama_server_argv`) but for what no buffer depends on (its name, address and port: the
    pass ends before it binds; no prompt cache)."""

    def words_at(cells: int) -> list[str]:
        return llama_server_argv(
            LlamaInvocation(
                model_path=model_path, alias="fit", host="127.0.0.1", port=0, threads=threads,
                slots=slots, context=cells, ubatch=ubatch, pooling=pooling, cache_ram_mib=0,
                load_mode=load_mode, speculative=speculative,
            )
        )  # fmt: skip

    return words_at


def measured_memory_at(
    llama_server: str,
    gguf: GgufFile,
    words_at: Callable[[int], Sequence[str]],
    *,
    slots: int,
    ubatch: int,
    embeddings: bool,
    shared_pool: bool = True,
) -> Callable[[int], LlamaMemory]:
    """The process's memory at a context (the tokens of the pool the slots share, or with
    `shared_pool` False of each slot), from llama-server's own pass at the words the plan
    gives it there (`words_at(cells)`)."""

    def memory_at(tokens: int) -> LlamaMemory:
        cells = padded_cells(tokens if shared_pool else tokens * slots)
        told = server_memory(llama_server, Path(gguf.path), words_at(cells))
        return as_plan_memory(
            told, gguf, cells=cells, slots=slots, ubatch=ubatch, embeddings=embeddings
        )

    return memory_at
