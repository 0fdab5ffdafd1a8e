"""What vLLM's decisions must never carry into a unit, checked before any unit is rendered
(the core's checks of every server, `epycd.render.policy`, first): the env and flags the
plan owns, the run flags a container needs and may not have, the pinning and OpenMP bind,
the KV pool, the endpoint file's own words, and the route (image, executable)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from epycd.engines.vllm.plan.invocation import CpuEngine, RocmEngine
from epycd.engines.vllm.plan.model import AnyVllmServer, VllmCpuServer, pre_invocation_flags
from epycd.engines.vllm.plan.tuning import front_end_cores
from epycd.host.cpulist import parse_cpulist
from epycd.render.policy import (
    IMAGE_PATTERN,
    check_cpus_and_nodes,
    check_identity,
    check_plain_path,
    is_fully_qualified,
    refuse,
    secret_files,
)
from epycd.spec.flags import flag_name, names
from epycd.spec.policy import arg_refusal, env_refusal
from epycd.stack import shipped_stack

REQUIRED_ENV = ("VLLM_CPU_OMP_THREADS_BIND",)
KV_BYTES_FLAG = "--kv-cache-memory-bytes"
FORBIDDEN_ENV = {
    "OMP_NUM_THREADS": "vLLM derives it from VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "vLLM's own default must apply",
    "HF_TOKEN": "a secret never goes in a unit: use hf_token_file",
    "HUGGING_FACE_HUB_TOKEN": "a secret never goes in a unit: use hf_token_file",
}
THROUGHPUT_SET = shipped_stack().throughput_flags
"""The throughput variables and their values: the stack's (data/epyc.json)."""
ENV_THE_PLAN_SETS = frozenset({*REQUIRED_ENV, *THROUGHPUT_SET, "HF_HOME", "VLLM_CPU_KVCACHE_SPACE"})
FLAGS_THE_PLAN_PASSES = frozenset(
    {
        "--host",
        "--port",
        "--dtype",
        "--max-model-len",
        "--max-num-seqs",
        KV_BYTES_FLAG,
        "--served-model-name",
        "--chat-template",
        "--revision",
    }
)
"""The plan passes these flags itself (and the variables of ENV_THE_PLAN_SETS); every other
variable and the endpoint file's own flags are held to its rules (epycd.spec.policy
env_refusal, arg_refusal) once more, and the file's flags may not give one of these."""
REQUIRED_RUN_FLAGS = tuple(shipped_stack().run_flags)
"""The container run flags every plan passes: the stack's (data/epyc.json)."""
FORBIDDEN_RUN_FLAGS = {
    "--shm-size": "podman refuses --shm-size together with --ipc=host",
    "--device": "the CPU path needs no device",
    "--cpuset-cpus": "the plan pins the CPUs",
    "--cpuset-mems": "the plan pins the NUMA nodes",
    "--ipc": "the container runs with --ipc=host",
    "--network": "the container runs with --network=host",
    "--net": "the container runs with --network=host",
}


def check_pinning(decisions: VllmCpuServer) -> None:
    cpus = check_cpus_and_nodes(decisions)
    check_bind(decisions, cpus)
    check_kv_pool(decisions)


def check_bind(decisions: VllmCpuServer, cpus: list[int]) -> None:
    """The OpenMP bind is the plan's `omp_cpus`, inside the pinned set, and leaves a core to
    the front end where rule 1 reserves one (docs/tuning.md)."""
    bind = decisions.env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    try:
        bind_cpus = parse_cpulist(bind)
        planned = parse_cpulist(decisions.omp_cpus)
    except ValueError:
        bind_cpus, planned = [], [-1]
    key = "env.VLLM_CPU_OMP_THREADS_BIND"
    if not bind_cpus or bind_cpus != planned or not set(bind_cpus) <= set(cpus):
        raise refuse(
            decisions,
            key,
            f"the OpenMP bind list {bind!r} is not the plan's {decisions.omp_cpus!r} inside "
            f"the pinned CPUs {decisions.cpus!r}",
            "plan the endpoint again",
        )
    if front_end_cores(len(cpus), pooling=decisions.pooling) and len(bind_cpus) >= len(cpus):
        raise refuse(
            decisions,
            key,
            f"the OpenMP bind list {bind!r} takes every pinned CPU: none is left to vLLM's "
            "API server and scheduler",
            "plan the endpoint again",
        )


def kv_bytes_given(decisions: VllmCpuServer) -> bool:
    """Whether vLLM gets the KV pool in bytes (--kv-cache-memory-bytes): the CPU engine's
    `kv_cache_memory_bytes`, or the flag in a record's words (`pre_invocation_flags`)."""
    invocation = decisions.invocation
    if invocation is None:
        return pre_invocation_flags(decisions).given(KV_BYTES_FLAG)
    engine = invocation.engine
    return isinstance(engine, CpuEngine) and engine.kv_cache_memory_bytes is not None


def check_kv_pool(decisions: VllmCpuServer) -> None:
    """The pool is given once: whole GiB in the legacy variable, or bytes in the flag."""
    kv = decisions.env.get("VLLM_CPU_KVCACHE_SPACE")
    if (kv is None) != kv_bytes_given(decisions):
        raise refuse(
            decisions,
            "env.VLLM_CPU_KVCACHE_SPACE",
            f"the KV pool must be given once: VLLM_CPU_KVCACHE_SPACE or {KV_BYTES_FLAG}",
            "plan the endpoint again",
        )
    if kv is not None and (not kv.isdecimal() or int(kv) < 1):
        raise refuse(
            decisions,
            "env.VLLM_CPU_KVCACHE_SPACE",
            f"the KV pool {kv!r} is not a whole number of GiB",
            "plan the endpoint again",
        )


def check_env(decisions: AnyVllmServer) -> None:
    for name in REQUIRED_ENV:
        if name not in decisions.env:
            raise refuse(decisions, f"env.{name}", f"{name} is not set", "plan the endpoint again")
    for name, why in FORBIDDEN_ENV.items():
        if name in decisions.env:
            raise refuse(
                decisions, f"env.{name}", f"{name} must not be set: {why}", f"remove {name}"
            )
    for name, value in decisions.env.items():
        refusal = None if name in ENV_THE_PLAN_SETS else env_refusal(name, value)
        if refusal:
            raise refuse(
                decisions, f"env.{name}", f"{name} must not be set: {refusal[0]}", refusal[1]
            )
    present = {name: decisions.env[name] for name in THROUGHPUT_SET if name in decisions.env}
    if present and present != THROUGHPUT_SET:
        wanted = " ".join(f"{name}={value}" for name, value in THROUGHPUT_SET.items())
        raise refuse(
            decisions,
            "env." + next(iter(present)),
            f"the throughput flags go together or not at all: {wanted}"
            f" (found {' '.join(f'{k}={v}' for k, v in present.items())})",
            "set throughput_flags = true, or none of the three",
        )
    if decisions.hf_token_file and "HF_TOKEN_PATH" in decisions.env:
        raise refuse(
            decisions,
            "env.HF_TOKEN_PATH",
            "HF_TOKEN_PATH is set and hf_token_file names the token too",
            "keep only hf_token_file",
        )


def check_args(decisions: AnyVllmServer) -> None:
    check_serve_args(decisions, FLAGS_THE_PLAN_PASSES)
    for index, flag in enumerate(decisions.run_flags):
        why = FORBIDDEN_RUN_FLAGS.get(flag_name(flag) or flag)
        if why and flag not in REQUIRED_RUN_FLAGS:
            raise refuse(decisions, f"run_flags[{index}]", f"{flag}: {why}", f"remove {flag}")


def check_serve_args(decisions: AnyVllmServer, passed: Collection[str]) -> None:
    """No argument the endpoint file must not pass reaches vLLM; `passed` are the flags the
    plan itself passes. Checked are the words that are not the plan's own: the file's
    (`invocation.extra`, keyed `extra_args[i]`) and an Instinct recipe's (`recipe_args[i]`),
    each held to `arg_refusal`, and the file's may not give a flag of `passed`. A record
    without `invocation` has only its whole argv (`pre_invocation_flags`, keyed
    `vllm_args[i]`), in which the words of `passed` are the plan's and allowed."""
    invocation = decisions.invocation
    if invocation is None:
        words = pre_invocation_flags(decisions).words
        _check_words(decisions, "vllm_args", words, allowed=passed)
        return
    extra = invocation.extra
    _check_words(decisions, "extra_args", extra.words)
    for flag in extra.flags:
        owned = next((p for p in sorted(passed) if names(flag.name, p)), None)
        if owned is not None:
            raise refuse(
                decisions,
                f"extra_args[{flag.position}]",
                f"{extra.words[flag.position]!r} must not reach vLLM ({owned}: the plan "
                "passes it itself)",
                "remove it",
            )
    if isinstance(invocation.engine, RocmEngine):
        _check_words(decisions, "recipe_args", invocation.engine.recipe_args)


def _check_words(
    decisions: AnyVllmServer,
    key: str,
    words: Sequence[str],
    allowed: Collection[str] = (),
) -> None:
    """Each word held to `arg_refusal`, but a flag of `allowed` as the plan writes it (the
    flag's own word, its value the next)."""
    for index, arg in enumerate(words):
        refusal = arg_refusal(arg)
        if refusal and arg not in allowed:
            shown = "a secret" if refusal.secret else repr(arg)
            raise refuse(
                decisions,
                f"{key}[{index}]",
                f"{shown} must not reach vLLM ({refusal.why})",
                refusal.fix,
            )


def check_runtime(decisions: AnyVllmServer) -> None:
    if decisions.runtime == "host":
        if not decisions.vllm_executable:
            raise refuse(
                decisions, "vllm", "the host path needs the vllm executable", "set vllm = PATH"
            )
        for key, secret in secret_files(decisions):
            check_plain_path(decisions, key, secret)
        return
    if not decisions.image or not IMAGE_PATTERN.fullmatch(decisions.image):
        raise refuse(
            decisions,
            "image",
            f"{decisions.image!r} is not a container image reference",
            "use NAME[:TAG][@DIGEST], e.g. docker.io/vllm/vllm-openai-cpu:v0.29.0-x86_64",
        )
    if decisions.runtime == "podman" and not is_fully_qualified(decisions.image):
        raise refuse(
            decisions,
            "image",
            f"{decisions.image!r} names no registry; podman would resolve the short name "
            "through registries.conf (Quadlet warns about it)",
            f"write it in full, e.g. docker.io/{decisions.image}",
        )
    paths = []
    if decisions.hf_cache:
        paths.append(("hf_cache", decisions.hf_cache.host_path))
        paths.append(("hf_cache", decisions.hf_cache.container_path))
    paths += secret_files(decisions)
    for index, mount in enumerate(decisions.extra_mounts):
        paths.append((f"extra_mounts[{index}]", mount.host_path))
        paths.append((f"extra_mounts[{index}]", mount.container_path))
    for key, path in paths:
        check_plain_path(decisions, key, path)


def check_decisions(decisions: VllmCpuServer) -> None:
    """Raise InputError on the first rule these decisions break."""
    check_identity(decisions)
    check_env(decisions)
    check_pinning(decisions)
    check_args(decisions)
    check_runtime(decisions)
