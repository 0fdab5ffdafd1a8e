"""The renderer refuses decisions that must never become a unit, naming file and key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from epycd.engines.vllm.plan.invocation import CpuEngine, RocmEngine
from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.engines.vllm.render import policy
from epycd.engines.vllm.render.commands import docker_run
from epycd.engines.vllm.render.policy import FLAGS_THE_PLAN_PASSES, check_serve_args
from epycd.errors import InputError
from epycd.spec.flags import ExtraFlags
from tests.render.argv_records import invocation_from_record
from tests.render.fixtures import genoa_podman, host_vllm, milan_docker, units_of

ALL = [genoa_podman, milan_docker, host_vllm]


def _refused(changes: dict[str, Any], key: str, factory: Any = genoa_podman) -> InputError:
    decisions = factory().model_copy(update=changes)
    with pytest.raises(InputError) as caught:
        units_of(decisions)
    assert caught.value.key == key
    assert caught.value.file == decisions.config_file
    return caught.value


@pytest.mark.parametrize("factory", ALL)
@pytest.mark.parametrize(
    "name",
    ["OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"],
)
def test_forbidden_environment(factory: Any, name: str) -> None:
    env = {**factory().env, name: "4"}
    _refused({"env": env}, f"env.{name}", factory)


@pytest.mark.parametrize("name", ["VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE"])
def test_tuning_environment_is_required(name: str) -> None:
    env = dict(genoa_podman().env)
    del env[name]
    _refused({"env": env}, f"env.{name}")


def test_bind_list_must_be_the_pinned_cpus() -> None:
    env = {**genoa_podman().env, "VLLM_CPU_OMP_THREADS_BIND": "0-95"}
    error = _refused({"env": env}, "env.VLLM_CPU_OMP_THREADS_BIND")
    assert "96-191" in error.message


@pytest.mark.parametrize(
    "partial",
    [
        {"TORCHINDUCTOR_FREEZING": "1"},
        {"TORCHINDUCTOR_FREEZING": "1", "VLLM_USE_AOT_COMPILE": "0"},
        {
            "TORCHINDUCTOR_FREEZING": "1",
            "VLLM_USE_AOT_COMPILE": "1",
            "ZENTORCH_WEIGHT_PREPACK": "1",
        },
        {"ZENTORCH_WEIGHT_PREPACK": "1"},
    ],
)
def test_throughput_flags_all_or_none(partial: dict[str, str]) -> None:
    env = {**host_vllm().env, **partial}
    error = _refused({"env": env}, f"env.{next(iter(partial))}", host_vllm)
    assert "together or not at all" in error.message


def test_the_full_throughput_set_renders() -> None:
    text = next(iter(units_of(genoa_podman()).values()))
    for assignment in (
        "TORCHINDUCTOR_FREEZING=1",
        "VLLM_USE_AOT_COMPILE=0",
        "ZENTORCH_WEIGHT_PREPACK=1",
    ):
        assert f"Environment={assignment}\n" in text


@pytest.mark.parametrize("factory", ALL)
@pytest.mark.parametrize("arg", ["--device", "--device=cpu"])
def test_no_device_argument(factory: Any, arg: str) -> None:
    args = [*factory().vllm_args, arg, "cpu"]
    _refused({"recorded_vllm_args": args}, f"vllm_args[{len(args) - 2}]", factory)


@pytest.mark.parametrize("factory", [genoa_podman, milan_docker])
@pytest.mark.parametrize(
    "flag", ["--shm-size=16g", "--shm-size", "--ipc=private", "--device=/dev/kfd"]
)
def test_no_shm_size_with_host_ipc_and_no_device(factory: Any, flag: str) -> None:
    flags = [*factory().run_flags, flag]
    _refused({"run_flags": flags}, f"run_flags[{len(flags) - 1}]", factory)


def test_token_path_from_env_and_file_conflict() -> None:
    env = {**genoa_podman().env, "HF_TOKEN_PATH": "/x"}
    _refused({"env": env, "hf_token_file": "/etc/epyc-llm/t"}, "env.HF_TOKEN_PATH")


@pytest.mark.parametrize("path", ["/srv/with space", "/srv/a:b", "relative", "/srv/$x", "/a,b"])
def test_container_mounts_must_survive_volume_syntax(path: str) -> None:
    decisions = genoa_podman()
    assert decisions.hf_cache is not None
    cache = decisions.hf_cache.model_copy(update={"host_path": path})
    _refused({"hf_cache": cache}, "hf_cache")


def test_host_path_allows_spaces_in_the_cache() -> None:
    text = next(iter(units_of(host_vllm()).values()))
    assert 'Environment="HF_HOME=/var/cache/hf home"\n' in text


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"endpoint": "Bad_Name", "unit_name": "epyc-llm-Bad_Name"}, "endpoint"),
        ({"unit_name": "something-else"}, "unit_name"),
        ({"port": 0}, "port"),
        ({"cpus": "a-b"}, "cpus"),
        ({"numa_nodes": []}, "numa_nodes"),
        ({"image": "bad image"}, "image"),
        ({"image": None}, "image"),
        ({"image": "vllm/vllm-openai-cpu:latest-x86_64"}, "image"),
        ({"model": "evil\nExecStartPre=/bin/rm -rf /"}, "model"),
        ({"served_model_name": "x\ny"}, "served_model_name"),
        ({"product_python": "python3"}, "product_python"),
    ],
)
def test_bad_values(changes: dict[str, Any], key: str) -> None:
    _refused(changes, key)


def test_host_path_needs_the_vllm_executable() -> None:
    _refused({"vllm_executable": None}, "vllm", host_vllm)


def test_newline_in_an_argument_is_refused_not_smuggled() -> None:
    for factory in ALL:
        args = [*factory().vllm_args, "--chat-template", "x\n[Service]\nExecStart=/bin/sh"]
        with pytest.raises(InputError, match="control character U\\+000A"):
            units_of(factory().model_copy(update={"recorded_vllm_args": args}))


def test_docker_accepts_a_docker_hub_short_name() -> None:
    decisions = milan_docker().model_copy(update={"image": "vllm/vllm-openai-cpu:latest-x86_64"})
    assert "vllm/vllm-openai-cpu:latest-x86_64 allenai" in next(iter(units_of(decisions).values()))


def test_docker_never_pulls_at_start() -> None:
    """An absent image fails the start at once, as with podman's Pull=never: docker run's
    default pulled at boot (seen in tests/e2e/test_containers.py), waiting on a registry."""
    argv = docker_run(milan_docker())
    assert "--pull=never" in argv[: argv.index(milan_docker().image or "")], argv


def test_host_token_file_must_be_a_plain_path() -> None:
    _refused({"hf_token_file": "/etc/epyc llm/t:x"}, "hf_token_file", host_vllm)


@pytest.mark.parametrize("factory", ALL)
@pytest.mark.parametrize(
    ("name", "value"),
    [("NOTIFY_SOCKET", "/run/x"), ("LD_PRELOAD", "/lib/evil.so"), ("PATH", "/tmp"),
     ("PYTHONPATH", "/tmp"), ("GOMP_CPU_AFFINITY", "0-3"), ("VLLM_API_KEY", "k"),
     ("VLLM_LOGGING_PREFIX", "hf_" + "a" * 34), ("MALLOC_CONF", "x")],
)  # fmt: skip
def test_environment_that_takes_over_never_reaches_a_unit(
    factory: Any, name: str, value: str
) -> None:
    env = {**factory().env, name: value}
    error = _refused({"env": env}, f"env.{name}", factory)
    assert value not in str(error) or len(value) < 3


@pytest.mark.parametrize("factory", ALL)
@pytest.mark.parametrize(
    "arg", ["-tp", "-O3", "--config=/x.yaml", "--uds=/run/s", "--headless",
            "--data-parallel-size=2", "--api-key=k3y", "--hf-token"],
)  # fmt: skip
def test_flags_the_plan_owns_never_reach_a_unit(factory: Any, arg: str) -> None:
    args = [*factory().vllm_args, arg]
    error = _refused({"recorded_vllm_args": args}, f"vllm_args[{len(args) - 1}]", factory)
    assert "k3y" not in str(error)


@pytest.mark.parametrize("factory", ALL)
def test_the_flags_the_plan_passes_itself_render(factory: Any) -> None:
    args = factory().vllm_args
    assert "--port" in args and "--host" in args
    assert units_of(factory())


# Decisions with their typed invocation, as the planner makes them: the checks
# read the file's own words (`invocation.extra`) and the engine, not the argv.


def typed(factory: Callable[[], VllmCpuServer] = genoa_podman, **changes: Any) -> VllmCpuServer:
    """A hand-written fixture with the invocation its argv gives, its words kept as approved
    (their older order has the plan's flags after the rest: no file's words), `changes` to
    it."""
    decisions = factory()
    kept = {"approved_argv": list(decisions.vllm_args), "extra": ExtraFlags()}
    invocation = invocation_from_record(decisions).model_copy(update=kept | changes)
    return decisions.model_copy(update={"invocation": invocation})


def _refused_typed(decisions: VllmCpuServer, key: str) -> InputError:
    with pytest.raises(InputError) as caught:
        units_of(decisions)
    assert (caught.value.key, caught.value.file) == (key, decisions.config_file)
    return caught.value


@pytest.mark.parametrize("factory", ALL)
def test_a_typed_record_renders(factory: Any) -> None:
    assert units_of(typed(factory)) == units_of(factory())


@pytest.mark.parametrize(
    "arg", ["--device=cpu", "--port=9000", "--max_model_len=8", "--api-key=k3y", "--hf-tok"]
)
def test_the_files_own_words_are_checked(arg: str) -> None:
    extra = ExtraFlags.of(["--enable-prefix-caching", arg])
    error = _refused_typed(typed(extra=extra), "extra_args[1]")
    assert "k3y" not in str(error)


def test_the_file_may_not_give_a_flag_the_plan_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even were arg_refusal to let it through: the plan's own flags are not the file's."""
    monkeypatch.setattr(policy, "arg_refusal", lambda arg: None)
    extra = ExtraFlags.of(["--seed", "7", "--max-num-seq=4"])
    error = _refused_typed(typed(extra=extra), "extra_args[2]")
    assert "--max-num-seqs: the plan passes it itself" in error.message


def test_the_argv_of_a_typed_record_is_not_read_for_the_files_words() -> None:
    """Its argv is emitted as stored; what the file gave is `invocation.extra`."""
    decisions = typed(extra=ExtraFlags.of(["--enable-prefix-caching"]))
    assert units_of(decisions)


def test_an_instinct_recipes_words_are_checked() -> None:
    engine = RocmEngine(recipe_args=["--block-size", "1", "--gpu-memory-utilization=1"])
    decisions = typed(engine=engine)
    with pytest.raises(InputError) as caught:
        check_serve_args(decisions, FLAGS_THE_PLAN_PASSES)
    assert caught.value.key == "recipe_args[2]"


def test_the_kv_pool_in_bytes_is_the_engines() -> None:
    """genoa_podman's pool is the GiB variable: the engine may not give bytes as well; the
    host fixture's is bytes: without them in the engine, the pool is not given."""
    gib = typed()
    assert gib.invocation is not None and isinstance(gib.invocation.engine, CpuEngine)
    both = gib.invocation.engine.model_copy(update={"kv_cache_memory_bytes": 64 * 1024**3})
    _refused_typed(typed(engine=both), "env.VLLM_CPU_KVCACHE_SPACE")
    host = typed(host_vllm)
    assert host.invocation is not None and isinstance(host.invocation.engine, CpuEngine)
    assert host.invocation.engine.kv_cache_memory_bytes
    none = host.invocation.engine.model_copy(update={"kv_cache_memory_bytes": None})
    _refused_typed(typed(host_vllm, engine=none), "env.VLLM_CPU_KVCACHE_SPACE")
