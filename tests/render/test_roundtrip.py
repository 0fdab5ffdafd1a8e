"""Round trip through a real systemd: what the units make systemd run is what was decided.

A `systemd --user` manager (tests/render/manager.py) loads the rendered units (and, for
podman, the services Quadlet 5.4 generates from the `.container`), starts them, and an argv
dumper standing in for the executables records exactly what systemd handed over.
Hypothesis draws endpoint names, model ids, served names, arguments and env values with
spaces, quotes, `%`, `$`, `\\` and unicode; control characters must be refused instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from epycd.engines.vllm.plan.model import AnyVllmServer
from epycd.errors import InputError
from epycd.spec.policy import arg_refusal, env_refusal
from tests.render import oracle
from tests.render.fixtures import CASES, runnable, units_of
from tests.render.manager import UserManager
from tests.render.realtools import quadlet_dryrun, verify, write_units

RESERVED_ENV = {
    "OMP_NUM_THREADS",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HOME",
    "TORCHINDUCTOR_FREEZING",
    "VLLM_USE_AOT_COMPILE",
    "ZENTORCH_WEIGHT_PREPACK",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_KVCACHE_SPACE",
}
TRICKY = [
    "%n",
    "%%",
    "%",
    "$HOME",
    "${HOME}",
    "$$",
    "$",
    "\\",
    "\\n",
    '"',
    "'",
    "a b",
    " lead",
    "trail ",
    ";",
    "",
    "é✓",
    "日本語",
    "\\x41",
    "--x=1 2",
    "#x",
    "[Service]",
    "=",
    "a\\",
]
printable = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=10)
value = st.one_of(
    printable,
    st.sampled_from(TRICKY),
    st.lists(st.one_of(printable, st.sampled_from(TRICKY)), min_size=2, max_size=4).map("".join),
)
names = st.from_regex(r"[a-z0-9][a-z0-9-]{0,12}", fullmatch=True)
env_names = st.from_regex(r"VLLM_[A-Za-z0-9_]{1,8}", fullmatch=True).filter(
    lambda name: name not in RESERVED_ENV and env_refusal(name, "") is None
)
"""Names an endpoint file may set: the renderer refuses the rest (tests/render/test_policy.py)."""
passable = value.filter(lambda arg: arg in ("", ";") or arg_refusal(arg) is None)


def _kv_flag(args: list[str]) -> list[str]:
    """The template's `--kv-cache-memory-bytes N` (the host fixture's vLLM 0.32 takes bytes)."""
    flag = "--kv-cache-memory-bytes"
    return [flag, args[args.index(flag) + 1]] if flag in args else []


def _variants(
    base: AnyVllmServer, name: str, manager: UserManager, token: str | None
) -> dict[str, AnyVllmServer]:
    variants: dict[str, AnyVllmServer] = {}
    for factory_case in ("genoa-podman", "milan-docker", "host-vllm"):
        template = CASES[factory_case]()
        endpoint = f"{name}-{factory_case[0]}"
        decisions = template.model_copy(
            update={
                "endpoint": endpoint,
                "unit_name": f"epyc-llm-{endpoint}",
                "model": base.model,
                "served_model_name": base.served_model_name,
                "recorded_vllm_args": [*base.vllm_args, *_kv_flag(template.vllm_args)],
                "env": {**template.env, **base.env},
                "podman_notify_healthy": base.podman_notify_healthy,
                "hf_token_file": token,
            }
        )
        variants[decisions.runtime] = oracle.on_this_machine(decisions, manager)
    return variants


def _round_trip(decisions_by_runtime: dict[str, AnyVllmServer], manager: UserManager) -> None:
    folder = manager.root / "render"
    services: dict[str, str] = {}
    containers: dict[str, str] = {}
    for decisions in decisions_by_runtime.values():
        for name, text in units_of(decisions).items():
            (containers if name.endswith(".container") else services)[name] = text
    if containers:
        write_units(folder / "quadlet", containers)
        generated = quadlet_dryrun(folder / "quadlet")
        assert len(generated) == len(containers)
        services.update(generated)
    verify(write_units(folder / "verify", services))
    runnable_units = {
        name: oracle.runnable_sandboxed(
            oracle.runnable_docker(oracle.runnable_generated(text, manager)), manager
        )
        for name, text in services.items()
    }
    manager.install(runnable_units)
    runs = manager.run_all(sorted(runnable_units))
    for decisions in decisions_by_runtime.values():
        run = runs[f"{decisions.unit_name}.service"]
        if decisions.runtime == "podman":
            oracle.check_container(decisions, run)
        else:
            oracle.check_service(decisions, run)


@pytest.mark.quadlet
def test_fixtures_round_trip(manager: UserManager) -> None:
    containers = ("genoa-podman", "podman-before-5", "gated-podman-token", "podman-before-5-key")
    for case in (*containers, "milan-docker", "docker-exposed-key"):
        decisions = oracle.on_this_machine(CASES[case](), manager)
        _round_trip({case: oracle.with_real_secrets(decisions, manager.root)}, manager)
    for case in ("host-vllm", "host-vllm-token", "host-ipv6-key"):
        decisions = oracle.on_this_machine(CASES[case](), manager)
        _round_trip({case: oracle.with_real_secrets(decisions, manager.root)}, manager)


@pytest.mark.quadlet
@settings(
    max_examples=int(os.environ.get("EPYC_RENDER_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    name=names,
    model=value,
    served=value,
    args=st.lists(passable, min_size=1, max_size=6),
    env=st.dictionaries(env_names, value, max_size=4),
    notify_healthy=st.booleans(),
    with_token=st.booleans(),
)
def test_random_decisions_verify_and_round_trip(
    manager: UserManager,
    name: str,
    model: str,
    served: str,
    args: list[str],
    env: dict[str, str],
    notify_healthy: bool,
    with_token: bool,
) -> None:
    base = CASES["genoa-podman"]().model_copy(
        update={
            "model": model,
            "served_model_name": served,
            "recorded_vllm_args": args,
            "env": env,
            "podman_notify_healthy": notify_healthy,
        }
    )
    assume(all(env_refusal(name, text) is None for name, text in env.items()))
    token = oracle.token_file(manager.root) if with_token else None
    variants = _variants(base, name, manager, token)
    if any(arg in ("", ";") for arg in args):
        with pytest.raises(InputError, match="Quadlet"):
            units_of(variants.pop("podman"))
    _round_trip(variants, manager)


@pytest.mark.quadlet
@pytest.mark.parametrize("arg", ["\xa0", "a\u2003", "\u3000b\xa0"])
def test_unicode_whitespace_at_the_end_of_a_line_survives(manager: UserManager, arg: str) -> None:
    """Quadlet trims Unicode whitespace from the end of `Exec=`; systemd would keep it. Found
    by the random round trip above (a lone U+00A0), pinned here."""
    base = CASES["genoa-podman"]().model_copy(
        update={"recorded_vllm_args": ["--x", arg], "env": {}, "podman_notify_healthy": True}
    )
    _round_trip(_variants(base, "space", manager, None), manager)


control = st.sampled_from(["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028"])


@settings(max_examples=60, deadline=None, database=None)
@given(
    before=printable,
    bad=control,
    after=printable,
    field=st.sampled_from(["model", "served_model_name", "arg", "env", "env_name"]),
    case=st.sampled_from(sorted(CASES)),
)
def test_control_characters_are_refused(
    before: str, bad: str, after: str, field: str, case: str
) -> None:
    decisions = runnable(CASES[case](), "/usr/bin/python3", Path("/usr/bin/true"))
    text = before + bad + after
    all_changes: dict[str, dict[str, object]] = {
        "model": {"model": text},
        "served_model_name": {"served_model_name": text},
        "arg": {"recorded_vllm_args": [*decisions.vllm_args, text]},
        "env": {"env": {**decisions.env, "VLLM_X": text}},
        "env_name": {"env": {**decisions.env, f"VLLM_X{bad}Y": "1"}},
    }
    bad_decisions = decisions.model_copy(update=all_changes[field])
    with pytest.raises(InputError) as caught:
        units_of(bad_decisions)
    assert caught.value.file == decisions.config_file
