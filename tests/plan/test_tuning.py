"""The tuning rules of docs/tuning.md on fake hosts: the bind leaves the front end its cores
(rule 1), max_num_seqs and the batch follow the profile and fit the memory (rule 2), the KV
pool is what the sequences need within the nodes' available memory and is passed the way the
vLLM version prefers (rule 3), a host vLLM without a C++ compiler, or whose interpreter has no
Python headers, runs eager or is refused (rule 4), every unit kind carries the limits
(rule 5)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from epycd.engines.vllm.plan.model import VllmCpuServer
from epycd.host.cpulist import parse_cpulist
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts, HostVllmFacts, RuntimeFacts
from epycd.plan.endpoint import Plan
from epycd.spec import parse_endpoint
from tests.hosts import CATALOGUE, write_host, write_python, write_venv_vllm, write_vllm_script
from tests.plan.conftest import PODMAN_5, PlanWorkspace, cpu

GIB = 1024**3
HostOf = Callable[..., HostFacts]
RULE_HOSTS = [
    "this-machine-genoa-vm",
    "genoa-9654-2s-nps1",
    "genoa-9654-2s-nps4",
    "turin-9965-2s-nosmt",
    "bergamo-9754",
]


def probe_says(version: str) -> Callable[[str], HostVllmFacts]:
    def probe(executable: str) -> HostVllmFacts:
        return HostVllmFacts(
            path=executable, present=True, version=version, platform="ZenCpuPlatform"
        )

    return probe


def plans(ws: PlanWorkspace, host: HostFacts, **kwargs: object) -> dict[str, Plan]:
    """A plan for every endpoint file of `ws`: a missing or refused one fails the test."""
    found = {}
    for name, result in ws.plan(host, **kwargs).items():
        assert result.plan is not None, result.errors
        found[name] = result.plan
    assert sorted(found) == sorted(path.stem for path in ws.config_dir.glob("*.toml"))
    return found


def decided(ws: PlanWorkspace, host: HostFacts, **kwargs: object) -> dict[str, VllmCpuServer]:
    """The decisions of `plans`: every endpoint here is one vLLM instance on CPUs."""
    return {name: cpu(plan) for name, plan in plans(ws, host, **kwargs).items()}


def expected_front_end(cores: int) -> int:
    """docs/tuning.md rule 1, written apart from the product's code."""
    return 0 if cores == 1 else 2 if cores >= 64 else 1


def check_bind(plan: VllmCpuServer, host: HostFacts) -> None:
    pinned = parse_cpulist(plan.cpus)
    bind = parse_cpulist(plan.env["VLLM_CPU_OMP_THREADS_BIND"])
    physical = set(parse_cpulist(host.socket(plan.socket).physical_cpus))
    assert bind == parse_cpulist(plan.omp_cpus)
    assert set(bind) <= set(pinned) <= physical
    front = expected_front_end(len(pinned))
    assert bind == sorted(pinned)[: len(pinned) - front], (plan.cpus, plan.omp_cpus)
    assert len(bind) >= 1


@pytest.mark.parametrize("name", RULE_HOSTS)
def test_the_bind_leaves_the_front_end_cores_within_the_pinned_set(
    ws: PlanWorkspace, host_of: HostOf, name: str
) -> None:
    host = host_of(name)
    for index in range(host.sockets):
        ws.endpoint(f"e{index}")
    for plan in plans(ws, host).values():
        decisions = cpu(plan)
        check_bind(decisions, host)
        [unit] = plan.units.values()
        assert f"--cpuset-cpus={decisions.cpus} " in unit, "the cpuset stays the instance's CPUs"
        assert f"VLLM_CPU_OMP_THREADS_BIND={decisions.omp_cpus}\n" in unit


def test_nps4_instances_of_24_cores_each_leave_one(ws: PlanWorkspace, host_of: HostOf) -> None:
    host = host_of("genoa-9654-2s-nps4")
    for index in range(8):
        ws.endpoint(f"e{index}")
    found = decided(ws, host)
    assert len(found) == 8
    for plan in found.values():
        check_bind(plan, host)
        assert len(parse_cpulist(plan.cpus)) == 24
        assert len(parse_cpulist(plan.omp_cpus)) == 23


def test_a_one_core_instance_binds_its_core(ws: PlanWorkspace, tmp_path: Path) -> None:
    shape = CATALOGUE["this-machine-genoa-vm"]
    from dataclasses import replace

    root = write_host(tmp_path / "one", replace(shape, cores_per_socket=1))
    host = detect_host(root, probe_runtimes=False).model_copy(
        update={"runtimes": RuntimeFacts(podman=PODMAN_5)}
    )
    ws.endpoint("llm")
    plan = decided(ws, host)["llm"]
    assert plan.omp_cpus == plan.cpus == "0"


def test_the_two_core_vm_holds_one_core_back_and_batches_like_vllm(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """The machine of benchmarks/serving-results.md: core 0 for OpenMP, core 1 for the
    front end; 4096-token Qwen3-0.6B sequences (448 MiB of KV each) fit the cap 11 times."""
    host = host_of("this-machine-genoa-vm")
    ws.endpoint("llm")
    plan = decided(ws, host)["llm"]
    assert (plan.cpus, plan.omp_cpus) == ("0-1", "0")
    assert plan.max_num_seqs > 1
    assert plan.max_num_batched_tokens == 2048
    per_sequence = plan.memory.kv_bytes_per_token * plan.max_model_len
    assert plan.max_num_seqs * per_sequence <= plan.kv_cache_gb * GIB
    assert (plan.max_num_seqs + 1) * per_sequence * 1.1 > plan.memory.kv_pool_cap_gb * GIB


@pytest.mark.parametrize("name", RULE_HOSTS)
@pytest.mark.parametrize("profile", ["balanced", "latency", "throughput"])
def test_the_pool_and_the_sequences_fit_the_nodes(
    ws: PlanWorkspace, host_of: HostOf, name: str, profile: str
) -> None:
    host = host_of(name)
    ws.endpoint("llm", f'profile = "{profile}"\n')
    plan = decided(ws, host)["llm"]
    assert plan.profile == profile
    available = sum(host.node(n).memory_available_bytes for n in plan.numa_nodes)
    weights = plan.memory.weights_gb * GIB
    assert plan.kv_cache_gb * GIB <= available - weights
    first_bound = min(parse_cpulist(plan.omp_cpus))
    first_node = next(n for n in plan.numa_nodes if first_bound in host.node(n).cpus)
    assert plan.kv_cache_gb * GIB <= host.node(first_node).memory_available_bytes
    need = plan.memory.kv_bytes_per_token * plan.max_model_len * plan.max_num_seqs
    assert need <= plan.kv_cache_gb * GIB
    assert plan.max_num_batched_tokens >= plan.max_num_seqs
    args = plan.vllm_args
    assert args[args.index("--max-num-seqs") + 1] == str(plan.max_num_seqs)
    assert args[args.index("--max-num-batched-tokens") + 1] == str(plan.max_num_batched_tokens)


@pytest.mark.parametrize("name", RULE_HOSTS[1:])
def test_balanced_and_throughput_never_go_below_vllms_defaults_where_memory_allows(
    ws: PlanWorkspace, host_of: HostOf, name: str
) -> None:
    host = host_of(name)
    ws.endpoint("llm", "max_model_len = 2048\n")
    balanced = decided(ws, host)["llm"]
    assert (balanced.max_num_seqs, balanced.max_num_batched_tokens) == (128, 2048)
    ws.endpoint("llm", 'max_model_len = 2048\nprofile = "throughput"\n')
    throughput = decided(ws, host)["llm"]
    assert (throughput.max_num_seqs, throughput.max_num_batched_tokens) == (256, 4096)


def test_latency_batches_fewer_sequences_in_shorter_steps(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    ws.endpoint("fast", 'profile = "latency"\nmax_model_len = 2048\n')
    ws.endpoint("wide", "max_model_len = 2048\n")
    found = decided(ws, host_of("genoa-9654-2s-nps1"))
    assert found["fast"].max_num_seqs < found["wide"].max_num_seqs
    assert found["fast"].max_num_batched_tokens <= found["wide"].max_num_batched_tokens
    assert found["fast"].kv_cache_gb < found["wide"].kv_cache_gb


def test_an_explicit_max_num_seqs_is_kept(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm", "max_num_seqs = 3\n")
    plan = decided(ws, host_of("genoa-9654-2s-nps1"))["llm"]
    assert plan.max_num_seqs == 3 and plan.max_num_batched_tokens == 2048


def test_a_bad_profile_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "llm.toml"
    result = parse_endpoint(path, b'profile = "fastest"\n', precisions=["bfloat16"])
    assert not result.ok
    [error] = result.errors
    assert (error.file, error.key) == (str(path), "profile")
    assert "balanced" in (error.fix or "")


def host_endpoint(ws: PlanWorkspace, extra: str = "") -> None:
    ws.endpoint("llm", f'runtime = "host"\nvllm = "/opt/zen/bin/vllm"\n{extra}')


def test_vllm_032_takes_the_pool_in_bytes(ws: PlanWorkspace, host_of: HostOf) -> None:
    host_endpoint(ws)
    plan = decided(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0"))["llm"]
    args = plan.vllm_args
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(plan.kv_cache_gb * GIB)
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env


def test_older_vllm_and_the_pinned_image_take_the_gib_variable(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    host_endpoint(ws)
    ws.endpoint("box")
    found = decided(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.25.1"))
    for plan in found.values():
        assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == str(plan.kv_cache_gb)
        assert "--kv-cache-memory-bytes" not in plan.vllm_args


def without_cxx(host: HostFacts) -> HostFacts:
    return host.model_copy(update={"cxx_compiler": None})


def test_the_fake_hosts_have_a_compiler_where_a_host_vllm_compiles(host_of: HostOf) -> None:
    assert host_of("genoa-9654-2s-nps1").cxx_compiler == "/usr/bin/g++"


def test_a_host_vllm_with_a_compiler_compiles(ws: PlanWorkspace, host_of: HostOf) -> None:
    host_endpoint(ws)
    plan = decided(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0"))["llm"]
    assert not plan.enforce_eager and "--enforce-eager" not in plan.vllm_args


def test_no_compiler_balanced_runs_eager_and_says_the_cost(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    host_endpoint(ws)
    host = without_cxx(host_of("genoa-9654-2s-nps1"))
    plan = decided(ws, host, probe=probe_says("0.32.0"))["llm"]
    assert plan.enforce_eager and "--enforce-eager" in plan.vllm_args
    assert any("fewer tokens/s" in w and "apt-get install g++" in w for w in plan.warnings)


def test_no_compiler_throughput_is_refused_with_the_fix(ws: PlanWorkspace, host_of: HostOf) -> None:
    host_endpoint(ws, 'profile = "throughput"\n')
    host = without_cxx(host_of("genoa-9654-2s-nps1"))
    result = ws.plan(host, probe=probe_says("0.32.0"))["llm"]
    assert result.plan is None and result.exit_code == 1
    assert "C++ compiler" in result.errors[0].message
    assert "apt-get install g++" in (result.errors[0].fix or "")


def test_containers_carry_their_own_compiler(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("llm", 'profile = "throughput"\n')
    plan = decided(ws, without_cxx(host_of("genoa-9654-2s-nps1")))["llm"]
    assert not plan.enforce_eager and "--enforce-eager" not in plan.vllm_args


RUNTIME_VLLM = "/opt/epyc-llm/runtime/bin/vllm"
SYSTEM_VLLM = "/usr/local/bin/vllm"
NO_HEADERS = (
    "no Python headers (Python.h) for /usr/bin/python3.11, which serves {vllm}: vLLM's "
    "compile step needs them; it runs eager (--enforce-eager): no inductor compile at start, "
    "fewer tokens/s; apt-get install python3.11-dev to compile"
)


def python_host(
    ws: PlanWorkspace, host_of: HostOf, *, headers: bool, vllm: str = RUNTIME_VLLM
) -> tuple[HostFacts, Path]:
    """The Genoa host root with Debian's python3.11 (with or without python3.11-dev) and a
    host vLLM run by it: the embedded runtime's venv, or a vllm outside a venv."""
    name = "genoa-9654-2s-nps1"
    host = host_of(name)
    root = ws.tmp / "hosts" / name
    write_python(root, "/usr", "3.11", headers=headers)
    if vllm == RUNTIME_VLLM:
        write_venv_vllm(root)
    else:
        write_vllm_script(root, vllm, "/usr/bin/python3")
    return host, root


@pytest.mark.parametrize("vllm", [RUNTIME_VLLM, SYSTEM_VLLM])
def test_a_host_vllm_whose_python_has_its_headers_compiles(
    ws: PlanWorkspace, host_of: HostOf, vllm: str
) -> None:
    host, root = python_host(ws, host_of, headers=True, vllm=vllm)
    ws.endpoint("llm", f'runtime = "host"\nvllm = "{vllm}"\nprofile = "throughput"\n')
    plan = decided(ws, host, probe=probe_says("0.32.0"), host_root=root)["llm"]
    assert not plan.enforce_eager and "--enforce-eager" not in plan.vllm_args
    assert not any("Python.h" in w for w in plan.warnings)


@pytest.mark.parametrize("vllm", [RUNTIME_VLLM, SYSTEM_VLLM])
def test_no_python_headers_balanced_runs_eager_and_names_the_fix(
    ws: PlanWorkspace, host_of: HostOf, vllm: str
) -> None:
    """g++ is there, python3.11-dev is not: the compile step would die on Python.h."""
    host, root = python_host(ws, host_of, headers=False, vllm=vllm)
    assert host.cxx_compiler == "/usr/bin/g++"
    ws.endpoint("llm", f'runtime = "host"\nvllm = "{vllm}"\n')
    plan = plans(ws, host, probe=probe_says("0.32.0"), host_root=root)["llm"]
    decisions = cpu(plan)
    assert decisions.enforce_eager and "--enforce-eager" in decisions.vllm_args
    assert NO_HEADERS.format(vllm=vllm) in decisions.warnings
    assert " --enforce-eager " in plan.units["epyc-llm-llm.service"]


def test_no_python_headers_throughput_is_refused_with_the_fix(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    host, root = python_host(ws, host_of, headers=False)
    ws.endpoint("llm", f'runtime = "host"\nvllm = "{RUNTIME_VLLM}"\nprofile = "throughput"\n')
    result = ws.plan(host, probe=probe_says("0.32.0"), host_root=root)["llm"]
    assert result.plan is None and result.exit_code == 1
    [error] = result.errors
    assert error.message == (
        f"no Python headers (Python.h) for /usr/bin/python3.11, which serves {RUNTIME_VLLM}: "
        "vLLM's start compiles the model with the inductor and would fail (CppCompileError: "
        "Python.h: No such file or directory)"
    )
    assert error.fix == 'apt-get install python3.11-dev (or set profile = "balanced" to run eager)'
    assert error.key == "vllm"


def test_no_compiler_and_no_headers_name_both(ws: PlanWorkspace, host_of: HostOf) -> None:
    host, root = python_host(ws, host_of, headers=False)
    ws.endpoint("llm", f'runtime = "host"\nvllm = "{RUNTIME_VLLM}"\n')
    plan = decided(ws, without_cxx(host), probe=probe_says("0.32.0"), host_root=root)["llm"]
    assert plan.enforce_eager
    [warning] = [w for w in plan.warnings if "--enforce-eager" in w]
    assert warning.startswith(
        "no C++ compiler (g++ or c++) on the service's PATH and no Python headers (Python.h) "
        f"for /usr/bin/python3.11, which serves {RUNTIME_VLLM}: "
    )
    assert warning.endswith("apt-get install g++ python3.11-dev to compile")


def test_no_compiler_alone_keeps_its_message(ws: PlanWorkspace, host_of: HostOf) -> None:
    host, root = python_host(ws, host_of, headers=True)
    ws.endpoint("llm", f'runtime = "host"\nvllm = "{RUNTIME_VLLM}"\n')
    plan = decided(ws, without_cxx(host), probe=probe_says("0.32.0"), host_root=root)["llm"]
    assert plan.enforce_eager
    assert (
        "no C++ compiler (g++ or c++) on the service's PATH: vLLM runs eager (--enforce-eager): "
        "no inductor compile at start, fewer tokens/s; apt-get install g++ to compile"
    ) in plan.warnings


@pytest.mark.parametrize("flag", ["--enforce-eager", "--enforce_eager", "--enforce-eag"])
def test_an_explicit_enforce_eager_is_not_checked(
    ws: PlanWorkspace, host_of: HostOf, flag: str
) -> None:
    """In any spelling vLLM reads (epycd.spec.flags): the plan adds no second one."""
    host, root = python_host(ws, host_of, headers=False)
    ws.endpoint(
        "llm",
        f'runtime = "host"\nvllm = "{RUNTIME_VLLM}"\nprofile = "throughput"\n'
        f'extra_args = ["{flag}"]\n',
    )
    plan = decided(ws, host, probe=probe_says("0.32.0"), host_root=root)["llm"]
    assert not plan.enforce_eager and "--enforce-eager" not in plan.vllm_args[:-1]
    assert plan.vllm_args[-1] == flag
    assert not any("Python.h" in w for w in plan.warnings)


def test_containers_carry_their_own_headers(ws: PlanWorkspace, host_of: HostOf) -> None:
    host, root = python_host(ws, host_of, headers=False)
    ws.endpoint("llm", 'profile = "throughput"\n')
    plan = decided(ws, host, host_root=root)["llm"]
    assert plan.runtime == "podman" and not plan.enforce_eager


def test_the_embedded_runtime_without_headers_runs_eager(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    """`runtime = "auto"` without a container runtime serves with the embedded runtime (here
    a venv in tmp_path over a Python of its own, read on this machine's root): its Python
    has no headers, the plan says which and where."""
    base = write_python(Path("/"), str(ws.tmp / "python"), "3.12", headers=False)
    runtime = ws.tmp / "runtime"
    vllm = write_venv_vllm(Path("/"), str(runtime), base, cfg_version="version = 3.12.8")
    ws.settings = ws.settings.model_copy(update={"runtime_dir": runtime})
    ws.endpoint("llm")
    host = host_of("genoa-9654-2s-nps1", RuntimeFacts())
    plan = decided(ws, host, probe=probe_says("0.32.0"), host_root=Path("/"))["llm"]
    assert (plan.runtime, plan.vllm_executable, plan.enforce_eager) == ("host", vllm, True)
    assert (
        f"no Python headers (Python.h) for {base}, which serves {vllm}: vLLM's compile step "
        "needs them; it runs eager (--enforce-eager): no inductor compile at start, fewer "
        f"tokens/s; install the headers of {base} ({ws.tmp}/python/include/python3.12/Python.h)"
        " to compile"
    ) in plan.warnings


def test_every_unit_kind_carries_the_limits(ws: PlanWorkspace, host_of: HostOf) -> None:
    host_endpoint(ws)
    ws.endpoint("box")
    found = plans(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0"))
    service = found["llm"].units["epyc-llm-llm.service"]
    container = found["box"].units["epyc-llm-box.container"]
    for text in (service, container):
        assert "\nLimitNOFILE=65536\n" in text and "\nLimitMEMLOCK=infinity\n" in text
    assert "--ulimit=nofile=65536:65536 --ulimit=memlock=-1:-1" in container


def stream_interval_of(plan: VllmCpuServer) -> int:
    """What vLLM will use: the flag's value, or its own default of 1 without it."""
    args = plan.vllm_args
    if "--stream-interval" not in args:
        return 1
    return int(args[args.index("--stream-interval") + 1])


@pytest.mark.parametrize(
    ("profile", "interval"), [("latency", 1), ("balanced", 4), ("throughput", 10)]
)
def test_the_profile_sets_the_tokens_per_streamed_chunk(
    ws: PlanWorkspace, host_of: HostOf, profile: str, interval: int
) -> None:
    host_endpoint(ws, f'profile = "{profile}"\n')
    plan = decided(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0"))["llm"]
    assert stream_interval_of(plan) == interval
    assert plan.vllm_args.count("--stream-interval") <= 1


def test_a_vllm_without_the_stream_interval_flag_gets_none(
    ws: PlanWorkspace, host_of: HostOf
) -> None:
    host_endpoint(ws, 'profile = "throughput"\n')
    plan = decided(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.11.0"))["llm"]
    assert "--stream-interval" not in plan.vllm_args


def test_the_pinned_image_streams_in_chunks_too(ws: PlanWorkspace, host_of: HostOf) -> None:
    ws.endpoint("box")
    plan = decided(ws, host_of("genoa-9654-2s-nps1"))["box"]
    assert stream_interval_of(plan) == 4


def test_an_explicit_stream_interval_is_kept(ws: PlanWorkspace, host_of: HostOf) -> None:
    host_endpoint(ws, 'extra_args = ["--stream-interval", "1"]\n')
    plan = decided(ws, host_of("genoa-9654-2s-nps1"), probe=probe_says("0.32.0"))["llm"]
    assert plan.vllm_args.count("--stream-interval") == 1
    assert stream_interval_of(plan) == 1
