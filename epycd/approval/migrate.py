"""Approval records of every format and era, brought to the shape today's `Approval` reads.

A record is read as JSON, its `format` (1 when absent) checked against `RECORD_FORMAT`, then
the steps of its format applied in order, then validated (`epycd.approval.record`). A record
of a newer format is refused as such: this epyc-llm cannot know what it means. The record on
disk is never rewritten here; only `epycctl approve` writes one, in today's format.

Format 1 is every record written so far, and its shape changed with the product (13 eras,
tests/approval/records/README.md). Each step below is named after what the commit that
introduced a key changed, and writes down what a record from before that commit means:

- a step is a dict -> dict function, reads nothing but the record, and adds only keys that
  are absent (detected by key presence; one step drops a key nothing reads), so it is
  idempotent and leaves a newer record as it is;
- a step moves or defaults data, it never re-derives a decision with today's rules: the
  values are those the record's approved units ran with (or what the field meant when it
  came), written here as literals so that a later change of a product default cannot
  change what an old record says;
- the plan's steps apply to the plan and to each member of an instance set.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from epycd.errors import InputError
from epycd.plan.problem import Problem

RECORD_FORMAT: Final = 4
"""The format `approve` writes. A record says it in `format`."""

Record = dict[str, Any]
Decisions = dict[str, Any]
Step = Callable[[Record], Record]

LEGACY_HOST = "0.0.0.0"
"""Where plans approved before the plan had `host` listened: every address (vLLM's default,
no --host in their argv)."""


def record_format(raw: Record) -> object:
    return raw.get("format", 1)


def each_decisions(step: Callable[[Decisions], Decisions]) -> Step:
    """A step on one set of decisions, applied to the plan and to each instance-set member."""

    def on_record(record: Record) -> Record:
        plan = record.get("plan")
        if not isinstance(plan, dict):
            return record
        plan = step(dict(plan))
        instances = plan.get("instances")
        if isinstance(instances, dict) and isinstance(instances.get("members"), list):
            members = [step(dict(m)) if isinstance(m, dict) else m for m in instances["members"]]
            plan["instances"] = {**instances, "members": members}
        return {**record, "plan": plan}

    on_record.__name__ = step.__name__
    on_record.__doc__ = step.__doc__
    return on_record


def defaults(decisions: Decisions, values: dict[str, Any]) -> Decisions:
    return {**values, **decisions}


@each_decisions
def drop_exec_start_pre(decisions: Decisions) -> Decisions:
    """b41a53b: the approval check moved from ExecStartPre= to ExecCondition=
    (`exec_condition`). The old `exec_start_pre` is dropped, not moved: the installed units
    keep running what was approved, and `python -m epycd.approval check` is no module today."""
    decisions = {k: v for k, v in decisions.items() if k != "exec_start_pre"}
    return defaults(decisions, {"exec_condition": []})


@each_decisions
def listen_host_all(decisions: Decisions) -> Decisions:
    """06b4c5a: the plan's listen address (`host`) and `api_key_file`. Before it vLLM was
    given no --host, so it listened on every address; no API key was possible."""
    return defaults(decisions, {"host": LEGACY_HOST, "api_key_file": None})


@each_decisions
def tuning_keys(decisions: Decisions) -> Decisions:
    """b8caa50: the tuning rules' fields. Before them OpenMP was bound to every pinned CPU
    (`omp_cpus` = `cpus`), vLLM batched its default 2048 tokens, the profile was what is now
    "balanced", vLLM compiled (no --enforce-eager), and the units set LimitNOFILE=65536 and
    LimitMEMLOCK=infinity."""
    values: dict[str, Any] = {
        "max_num_batched_tokens": 2048,
        "profile": "balanced",
        "enforce_eager": False,
        "limit_nofile": 65536,
        "limit_memlock": "infinity",
    }
    if "cpus" in decisions:
        values["omp_cpus"] = decisions["cpus"]
    return defaults(decisions, values)


@each_decisions
def memory_keys(decisions: Decisions) -> Decisions:
    """b8caa50 (`kv_pool_cap_gb`) and 74402cb (`runtime_gb`, `process_gb`): parts of the
    memory fit the estimate did not count yet, 0 then."""
    memory = decisions.get("memory")
    if not isinstance(memory, dict):
        return decisions
    memory = defaults(memory, {"kv_pool_cap_gb": 0, "runtime_gb": 0.0, "process_gb": 0.0})
    return {**decisions, "memory": memory}


@each_decisions
def errors_as_problems(decisions: Decisions) -> Decisions:
    """abcecab: an error is a `Problem`, no longer a plain string (a refusal then)."""
    errors = decisions.get("errors")
    if not isinstance(errors, list) or not any(isinstance(e, str) for e in errors):
        return decisions
    return {**decisions, "errors": [_problem(e) if isinstance(e, str) else e for e in errors]}


def _problem(text: str) -> dict[str, Any]:
    problem = Problem.legacy(text)
    assert isinstance(problem, Problem)
    return problem.model_dump(mode="json")


@each_decisions
def home_read_paths(decisions: Decisions) -> Decisions:
    """b22de91: the paths under /home a host unit reads (ProtectHome= exceptions); none
    were needed before."""
    return defaults(decisions, {"home_read_paths": []})


def device_keys(record: Record) -> Record:
    """c7dd30b: Instinct endpoints. Every earlier endpoint ran on CPUs, on no GPU, one
    process; the host shape had no GPUs recorded."""
    record = _device_decisions(record)
    shape = record.get("host_shape")
    if isinstance(shape, dict):
        record = {**record, "host_shape": defaults(shape, {"gpus": {}})}
    return record


@each_decisions
def _device_decisions(decisions: Decisions) -> Decisions:
    return defaults(
        decisions,
        {
            "device": "cpu",
            "gpus": [],
            "gfx_version": None,
            "tensor_parallel_size": 1,
            "gpu_fit": None,
        },
    )


@each_decisions
def instance_keys(decisions: Decisions) -> Decisions:
    """a601a89: instance sets. Every earlier endpoint was one instance, no set."""
    return defaults(decisions, {"instance": None, "instances": None})


def image_digest(record: Record) -> Record:
    """a256ce0: approve records the image's digest; earlier records did not ask."""
    return defaults(record, {"image_digest": None})


@each_decisions
def healing_none(decisions: Decisions) -> Decisions:
    """b30f55f: the `healing` policy. None is a record from before it: its units were
    rendered from `restart` alone (epycd.render.healing's legacy path)."""
    return defaults(decisions, {"healing": None})


@each_decisions
def invocation_none(decisions: Decisions) -> Decisions:
    """b2dcb00: the typed vLLM invocation. None is a record from before it: its words are
    its stored `vllm_args`, rendered as they are."""
    return defaults(decisions, {"invocation": None})


PLAN_KEYS = ("units", "unit_dirs", "fingerprint", "inputs_fingerprint")
"""What a plan holds beside its decisions (format 2: `plan.decisions`)."""
SET_LEFTOVERS = (
    "instance", "socket", "socket_reason", "cpus", "omp_cpus", "numa_nodes", "env",
    "kv_cache_gb", "memory", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "enforce_eager", "vllm_args", "invocation",
)  # fmt: skip
"""Format 1 kept these on a set's top level: member 0's words and env, and the members'
union or worst; format 2 computes the aggregates from the members and has no member 0."""
GPU_KEYS = ("gpus", "gfx_version", "tensor_parallel_size", "gpu_fit")
CPU_ONLY_KEYS = ("omp_cpus", "max_num_batched_tokens", "memory")
"""Format 1 gave an Instinct endpoint "" OpenMP CPUs, 0 batched tokens and a memory fit of
VRAM figures with CPU zeros: its VRAM fit is `gpu_fit`."""


def typed_decisions(flat: Decisions) -> Decisions:
    """Format 1's flat decisions (one shape for every kind) as format 2's: `kind` says which,
    and each kind keeps only its own keys."""
    device = flat.get("device", "cpu")
    instances = flat.get("instances")
    rest = {k: v for k, v in flat.items() if k not in ("device", "instances")}
    if isinstance(instances, dict):
        members = instances.get("members")
        if isinstance(members, list):
            members = [typed_decisions(m) if isinstance(m, dict) else m for m in members]
            instances = {**instances, "members": members}
        drop = {*SET_LEFTOVERS, *GPU_KEYS}
        return {
            "kind": "set",
            **{k: v for k, v in rest.items() if k not in drop},
            "instances": instances,
        }
    if device == "instinct":
        return {"kind": "instinct", **{k: v for k, v in rest.items() if k not in CPU_ONLY_KEYS}}
    return {"kind": "cpu", **{k: v for k, v in rest.items() if k not in GPU_KEYS}}


def typed_plan(record: Record) -> Record:
    """18e12d3, format 2: one type per kind of endpoint. The plan holds `decisions` (with `kind`)
    beside its units and fingerprints, instead of being flat decisions with them."""
    plan = record.get("plan")
    if isinstance(plan, dict) and "decisions" not in plan:
        flat = {k: v for k, v in plan.items() if k not in PLAN_KEYS}
        plan = {
            "decisions": typed_decisions(flat),
            **{k: v for k, v in plan.items() if k in PLAN_KEYS},
        }
    return {**record, "plan": plan, "format": 2}


def words_from_invocation(record: Record) -> Record:
    """Format 3: a plan made since stores its engine's typed invocation alone, and its words
    (`vllm_args`, `server_args`) are made from it when read. A format-2 record's stored
    `vllm_args` stay as they are: they are the words its approved units ran, and today's
    `VllmProcess` reads them as such (`recorded_vllm_args`); its `server_args` were always
    its invocation's words."""
    return {**record, "format": 3}


def one_endpoint_type(record: Record) -> Record:
    """Format 4: one endpoint type. The plan's decisions are the endpoint's service and its
    `servers`, each a server's own decisions, with a set's balancing in `instances`; before,
    they were one flat object per kind: a server's, or a set's service with its members
    under `instances`. A server's decisions keep every key they had (reading fills nothing
    from the service that they hold), so the units they rendered are rendered again."""
    plan = record.get("plan")
    if not isinstance(plan, dict) or not isinstance(plan.get("decisions"), dict):
        return {**record, "format": 4}
    decisions = plan["decisions"]
    if "servers" in decisions:
        return {**record, "format": 4}
    instances = decisions.get("instances")
    if isinstance(instances, dict) and "members" in instances:
        shape = {k: v for k, v in instances.items() if k != "members"}
        top = {k: v for k, v in decisions.items() if k not in ("kind", "instances")}
        endpoint = {**top, "servers": instances["members"], "instances": shape}
    else:
        endpoint = {**decisions, "servers": [decisions]}
    return {**record, "plan": {**plan, "decisions": endpoint}, "format": 4}


FORMAT_1_STEPS: tuple[Step, ...] = (
    drop_exec_start_pre,
    listen_host_all,
    tuning_keys,
    memory_keys,
    errors_as_problems,
    home_read_paths,
    device_keys,
    instance_keys,
    image_digest,
    healing_none,
    invocation_none,
)
"""What format-1 records of each era lack, in the order of the commits that added it."""

STEPS: dict[int, tuple[Step, ...]] = {
    1: (*FORMAT_1_STEPS, typed_plan),
    2: (words_from_invocation,),
    3: (one_endpoint_type,),
    4: (),
}
"""Format -> the steps that bring a record of that format to the next one (the last format:
to today's shape). A record of format v goes through `STEPS[v]`, ... `STEPS[RECORD_FORMAT]`."""


def migrate(raw: object) -> object:
    """The record `raw` (parsed JSON) in today's shape, ready for `Approval.model_validate`.
    Raises `InputError` for a format above `RECORD_FORMAT`; anything that is not a record
    of a known format is returned as it is, for the validation to name what is wrong."""
    if not isinstance(raw, dict):
        return raw
    version = record_format(raw)
    if type(version) is not int or version < 1:
        return raw
    if version > RECORD_FORMAT:
        raise InputError(
            f"written by a newer epyc-llm (format {version}; this one reads up to format "
            f"{RECORD_FORMAT})",
            fix="upgrade epyc-llm",
        )
    record: Record = raw
    for step_format in range(version, RECORD_FORMAT + 1):
        for step in STEPS[step_format]:
            record = step(record)
    return record


def migrated_plan(plan: Decisions) -> Decisions:
    """A plan as an older record stored it, in today's shape (the plan's steps only)."""
    record = migrate({"format": 1, "plan": plan})
    assert isinstance(record, dict)
    result: Decisions = record["plan"]
    return result


def parse_record(text: str) -> object:
    """The record's JSON, migrated (`json.JSONDecodeError` when it is not JSON)."""
    return migrate(json.loads(text))
