"""`python -m epycd.approval.check NAME`, the ExecCondition of every endpoint unit, against
fake host roots: the approved host passes, a changed one is refused in one journal line, and
so is a host vLLM approved compiled whose C++ compiler or Python headers went away."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from epycd.engines.vllm.plan.invocation import CpuEngine, VllmInvocation
from epycd.plan.endpoint import Plan
from epycd.spec.flags import ExtraFlags
from tests.approval.conftest import ApprovalSandbox
from tests.approval.plans import make_plan
from tests.hosts import CATALOGUE, write_host, write_proc_stat, write_python, write_venv_vllm
from tests.render.fixtures import cpu_decisions, with_decisions

APPROVED = CATALOGUE["genoa-9654-2s-nps1"]


def boot_check(
    env: ApprovalSandbox, name: str, host_root: Path
) -> subprocess.CompletedProcess[str]:
    return env.epycctl(name, module="epycd.approval.check", EPYCD_HOST_ROOT=str(host_root))


def approve_chat(env: ApprovalSandbox, socket: int = 0, plan: Plan | None = None) -> None:
    env.set_plans(plan or make_plan("chat", env.host(), env.settings.config_dir, socket=socket))
    done = env.epycctl("approve", "chat", "--yes", "--no-start")
    assert done.returncode == 0, done.stderr


def refused_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("epyc-llm-chat: ")
    assert lines[0].endswith("run `epycctl plan chat` and `epycctl approve chat`")
    return lines[0]


def test_accepts_the_approved_host(env: ApprovalSandbox) -> None:
    approve_chat(env)
    done = boot_check(env, "chat", env.host_root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "epyc-llm-chat: host and units match the approval"
    assert done.stderr == ""


def test_refuses_fewer_cores(env: ApprovalSandbox) -> None:
    approve_chat(env)
    smaller = write_host(env.tmp / "smaller", replace(APPROVED, cores_per_socket=64))
    line = refused_line(boot_check(env, "chat", smaller))
    assert "host changed since approval: socket 0 physical cores 96 -> 64" in line


def test_refuses_another_cpu(env: ApprovalSandbox) -> None:
    approve_chat(env)
    turin = write_host(env.tmp / "turin", CATALOGUE["turin-9965"])
    line = refused_line(boot_check(env, "chat", turin))
    assert "EPYC generation Genoa -> Turin" in line
    assert "socket 0 physical cores 96 -> 192" in line


def test_refuses_a_lost_socket(env: ApprovalSandbox) -> None:
    approve_chat(env, socket=1)
    one_socket = write_host(env.tmp / "one", replace(APPROVED, sockets=1))
    line = refused_line(boot_check(env, "chat", one_socket))
    assert "socket 1 is gone (1 socket(s) now)" in line


def test_refuses_memory_below_the_plan(env: ApprovalSandbox) -> None:
    approve_chat(env)
    small = write_host(env.tmp / "small", replace(APPROVED, node_memory_gib=16.0))
    line = refused_line(boot_check(env, "chat", small))
    assert "socket 0 memory 384 GiB -> 16 GiB, below the 21 GiB the plan needs" in line


def test_ignores_volatile_figures(env: ApprovalSandbox) -> None:
    """More memory (lazy memory init grows MemTotal), other free memory, a busy socket 0."""
    approve_chat(env)
    grown = write_host(env.tmp / "grown", replace(APPROVED, node_memory_gib=512.0))
    write_proc_stat(grown, {cpu: (9000, 0, 1000, 0) for cpu in range(384)})
    done = boot_check(env, "chat", grown)
    assert done.returncode == 0, done.stderr


def test_refuses_edited_units_and_missing_approval(env: ApprovalSandbox) -> None:
    approve_chat(env)
    service = env.settings.unit_dir / "epyc-llm-chat.service"
    service.write_text(service.read_text() + "CPUAffinity=0-191\n")
    line = refused_line(boot_check(env, "chat", env.host_root))
    assert f"installed units differ from the approval: {service} differs" in line
    done = boot_check(env, "other", env.host_root)
    assert done.returncode == 1
    assert "epyc-llm-other: no approval record" in done.stderr


def test_unreadable_host_is_bad_input(env: ApprovalSandbox) -> None:
    approve_chat(env)
    done = boot_check(env, "chat", env.tmp / "nowhere")
    assert done.returncode == 2
    assert "epyc-llm-chat: approval check failed:" in done.stderr
    assert "proc/cpuinfo: missing" in done.stderr


def test_refuses_a_new_nps_setting(env: ApprovalSandbox) -> None:
    approve_chat(env)
    nps4 = write_host(env.tmp / "nps4", CATALOGUE["genoa-9654-2s-nps4"])
    line = refused_line(boot_check(env, "chat", nps4))
    assert "host changed since approval: socket 0 NUMA nodes [0] -> [0, 1, 2, 3]" in line
    assert "physical cores" not in line


def with_python(env: ApprovalSandbox) -> Path:
    """The approved host's Debian python3.11 with python3.11-dev, and the approved plans'
    host vLLM (/opt/vllm/bin/vllm, tests/approval/plans.py) in a venv made from it; returns
    its Python.h."""
    write_python(env.host_root, "/usr", "3.11", headers=True)
    assert write_venv_vllm(env.host_root, "/opt/vllm", "/usr/bin/python3.11") == (
        "/opt/vllm/bin/vllm"
    )
    return env.host_root / "usr/include/python3.11/Python.h"


COMPILED = "compile prerequisite gone since approval (approved compiled, without --enforce-eager): "


def test_a_compiled_host_vllm_starts_with_its_prerequisites(env: ApprovalSandbox) -> None:
    with_python(env)
    approve_chat(env)
    done = boot_check(env, "chat", env.host_root)
    assert done.returncode == 0, done.stderr


def test_refuses_a_compiled_host_vllm_whose_python_headers_went(env: ApprovalSandbox) -> None:
    """python3.11-dev removed after approval: the compile step would die on Python.h."""
    header = with_python(env)
    approve_chat(env)
    header.unlink()
    line = refused_line(boot_check(env, "chat", env.host_root))
    assert line == (
        f"epyc-llm-chat: {COMPILED}no Python headers (Python.h) for /usr/bin/python3.11, which "
        "serves /opt/vllm/bin/vllm: apt-get install python3.11-dev, or approve again to run "
        "eager; run `epycctl plan chat` and `epycctl approve chat`"
    )


def test_refuses_a_compiled_host_vllm_whose_compiler_went(env: ApprovalSandbox) -> None:
    with_python(env)
    approve_chat(env)
    (env.host_root / "usr/bin/g++").unlink()
    line = refused_line(boot_check(env, "chat", env.host_root))
    assert line == (
        f"epyc-llm-chat: {COMPILED}no C++ compiler (g++ or c++) on the service's PATH: "
        "apt-get install g++, or approve again to run eager; "
        "run `epycctl plan chat` and `epycctl approve chat`"
    )


@pytest.mark.parametrize(
    ("flag", "planned"), [("--enforce-eager", True), ("--enforce_eager", False)]
)
def test_an_eager_host_vllm_needs_neither(env: ApprovalSandbox, flag: str, planned: bool) -> None:
    """Eager by the plan (rule 4), or by the endpoint file's own flag in any spelling."""
    header = with_python(env)
    plan = make_plan("chat", env.host(), env.settings.config_dir)
    decisions = cpu_decisions(plan)
    words = {"recorded_vllm_args": [*decisions.vllm_args, flag], "enforce_eager": planned}
    eager = with_decisions(plan, **words)
    approve_chat(env, plan=eager)
    header.unlink()
    (env.host_root / "usr/bin/g++").unlink()
    done = boot_check(env, "chat", env.host_root)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("extra", "planned", "argv", "runs"),
    [
        (["--enforce_eager"], False, [], True),
        ([], True, [], True),
        ([], False, ["--enforce-eager"], False),
    ],
)
def test_a_typed_plans_eager_is_its_invocations(
    env: ApprovalSandbox, extra: list[str], planned: bool, argv: list[str], runs: bool
) -> None:
    """With the typed invocation, eager is `invocation.eager` (the engine's, or the file's
    flag in `extra`): the argv is not read back (its last case says eager, the invocation
    does not, and the check holds to the invocation)."""
    header = with_python(env)
    plan = make_plan("chat", env.host(), env.settings.config_dir)
    d = cpu_decisions(plan)
    invocation = VllmInvocation(
        model_arg=d.vllm_args[0], dtype=d.dtype, max_model_len=d.max_model_len,
        host=d.host, port=d.port, served_model_name=d.served_model_name,
        extra=ExtraFlags.of(extra), approved_argv=[*d.vllm_args, *argv],
        engine=CpuEngine(omp_cpus=d.omp_cpus, max_num_seqs=d.max_num_seqs,
                         max_num_batched_tokens=d.max_num_batched_tokens,
                         enforce_eager=planned),
    )  # fmt: skip
    typed = with_decisions(plan, recorded_vllm_args=[*d.vllm_args, *argv], invocation=invocation)
    approve_chat(env, plan=typed)
    header.unlink()
    done = boot_check(env, "chat", env.host_root)
    if runs:
        assert done.returncode == 0, done.stderr
    else:
        assert "compile prerequisite gone since approval" in refused_line(done)


def test_a_container_endpoint_needs_neither(env: ApprovalSandbox) -> None:
    header = with_python(env)
    env.set_plans(make_plan("chat", env.host(), env.settings.config_dir, runtime="podman"))
    done = env.epycctl("approve", "chat", "--yes", "--no-start", "--no-pull")
    assert done.returncode == 0, done.stderr
    header.unlink()
    (env.host_root / "usr/bin/g++").unlink()
    done = boot_check(env, "chat", env.host_root)
    assert done.returncode == 0, done.stderr
