"""No runtime on the host: quickstart prints the one-time fix, exits 1 and changes nothing."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from epycd.cli.quickstart import (
    NoRuntime,
    chosen_runtime,
    found_text,
    no_runtime_text,
    vllm_fixes,
)
from epycd.engines.vllm.plan.route import choose_runtime
from epycd.errors import Refusal
from epycd.host.detect import detect_host
from epycd.host.facts import DockerFacts, HostVllmFacts, PodmanFacts, RuntimeFacts
from epycd.host.runtimes import probe_runtimes
from epycd.spec import EndpointSpec
from tests.hosts import make_host
from tests.machine import real_cpu
from tests.sandbox import CliSandbox

FIXES = (
    "make docker reachable",
    "install podman >= 4.4",
    "epycctl quickstart --vllm /path/to/env/bin/vllm",
    "provision the embedded vLLM (about 1 GB to download): packaging/install.sh --runtime",
    "build llama.cpp's llama-server for this CPU (about 13 minutes on 2 cores): "
    "packaging/install.sh --engine llama.cpp",
    "Nothing was changed.",
)
LLAMA_FIX = FIXES[4]


def assert_refused_unchanged(sandbox: CliSandbox, stderr: str, returncode: int) -> None:
    assert returncode == 1, stderr
    for fix in FIXES:
        assert fix in stderr
    assert "epycctl: no runtime to serve with" in stderr
    assert "llama-server: not built in " in stderr
    assert sandbox.written() == []


def test_this_machine_real_probes(sandbox: CliSandbox) -> None:
    """The real podman, docker and PATH of this machine, whatever they are. Without a
    runtime: the one-time fix, each probe's finding named. With one (a Quadlet podman, a
    docker daemon, a vllm on PATH): quickstart goes on to plan the default model, which is
    not in this empty cache with the hub off: exit 1, nothing written either way."""
    runtimes = probe_runtimes()
    has_runtime = chosen_runtime(runtimes, vllm_given=False) is not None or bool(
        shutil.which("vllm")
    )
    done = sandbox.epycctl("quickstart", "--yes")
    if has_runtime:
        assert done.returncode == 1, done.stderr
        said = done.stdout + done.stderr
        reasons = ["Qwen/Qwen3-0.6B is not in the local cache"]
        if not real_cpu().is_amd_epyc:
            reasons.append("not an AMD EPYC CPU")
        assert any(reason in said for reason in reasons), said
        assert "no runtime to serve with" not in done.stderr
        assert sandbox.written() == []
        return
    assert_refused_unchanged(sandbox, done.stderr, done.returncode)
    if runtimes.podman.present:
        assert f"podman {runtimes.podman.version}: no Quadlet (needs >= 4.4)" in done.stderr
    else:
        assert "podman: not installed" in done.stderr
    if runtimes.docker.present:
        assert "the daemon does not answer" in done.stderr
    else:
        assert "docker: not installed" in done.stderr
    assert "vllm: none given with --vllm and none on PATH" in done.stderr
    assert "Plan for endpoint" not in done.stdout


def test_fake_host_without_podman_or_docker(sandbox: CliSandbox) -> None:
    """A fake host root, and a PATH without podman, docker or vllm at all."""
    sandbox.use_fake_host()
    done = sandbox.epycctl("quickstart", "--yes", system_path=False)
    assert_refused_unchanged(sandbox, done.stderr, done.returncode)
    assert "podman: not installed" in done.stderr
    assert "docker: not installed" in done.stderr


def test_a_vllm_on_path_that_does_not_work_is_named(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    fake = sandbox.bin_dir / "vllm"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    done = sandbox.epycctl("quickstart", "--yes", system_path=False)
    assert_refused_unchanged(sandbox, done.stderr, done.returncode)
    assert f"vllm {fake}:" in done.stderr


def test_an_engine_asked_for_names_only_its_own_runtime_steps(sandbox: CliSandbox) -> None:
    """quickstart without --engine chooses among every engine's runtime, and names each
    one's step; --engine vllm names vLLM's alone."""
    sandbox.use_fake_host()
    done = sandbox.epycctl("quickstart", "--yes", "--engine", "vllm", system_path=False)
    assert done.returncode == 1, done.stderr
    assert "epycctl: no runtime to serve with" in done.stderr
    assert FIXES[3] in done.stderr
    assert LLAMA_FIX not in done.stderr and "llama-server" not in done.stderr
    assert sandbox.written() == []


def test_a_bad_vllm_argument_is_bad_input(sandbox: CliSandbox) -> None:
    sandbox.use_fake_host()
    missing = sandbox.tmp / "no-such-env"
    done = sandbox.epycctl("quickstart", "--yes", "--vllm", str(missing))
    assert done.returncode == 2, done.stderr
    assert "--vllm" in done.stderr and str(missing) in done.stderr
    assert sandbox.written() == []


@pytest.mark.parametrize(
    ("runtimes", "given", "expected"),
    [
        (RuntimeFacts(), False, None),
        (RuntimeFacts(podman=PodmanFacts(present=True, version="4.3.1")), False, None),
        (
            RuntimeFacts(podman=PodmanFacts(present=True, version="5.4.2", quadlet=True)),
            False,
            "podman",
        ),
        (RuntimeFacts(docker=DockerFacts(present=True, daemon_reachable=True)), False, "docker"),
        (RuntimeFacts(docker=DockerFacts(present=True)), False, None),
        (RuntimeFacts(vllm=HostVllmFacts(path="/v", present=True)), False, "host"),
        (RuntimeFacts(vllm=HostVllmFacts(path="/v", present=False, error="x")), False, None),
        (
            RuntimeFacts(
                podman=PodmanFacts(present=True, version="5.4.2", quadlet=True),
                vllm=HostVllmFacts(path="/v", present=True),
            ),
            False,
            "podman",
        ),
        (
            RuntimeFacts(
                podman=PodmanFacts(present=True, version="5.4.2", quadlet=True),
                vllm=HostVllmFacts(path="/v", present=True),
            ),
            True,
            "host",
        ),
    ],
)
def test_runtime_choice(runtimes: RuntimeFacts, given: bool, expected: str | None) -> None:
    assert chosen_runtime(runtimes, vllm_given=given) == expected


def test_fix_text_names_what_was_found() -> None:
    runtimes = RuntimeFacts(
        podman=PodmanFacts(present=True, version="4.3.1"),
        docker=DockerFacts(present=True, version="28.2.2"),
        vllm=HostVllmFacts(path="/opt/env/bin/vllm", present=False, error="no such file"),
    )
    runtime_dir = Path("/opt/epyc-llm/runtime")
    text = no_runtime_text(NoRuntime(found_text(runtimes, runtime_dir), vllm_fixes(runtime_dir)))
    assert "podman 4.3.1: no Quadlet (needs >= 4.4)" in text
    assert "docker 28.2.2: the daemon does not answer" in text
    assert "vllm /opt/env/bin/vllm: no such file" in text


def test_quickstart_picks_what_the_planners_auto_picks(tmp_path: Path) -> None:
    """One runtime precedence: quickstart's choice is the planner's `runtime = "auto"`, for
    every mix of podman (Quadlet or not), docker (none, daemon down, up) and host vLLM."""
    detected = detect_host(make_host(tmp_path, "vm-zen5"), probe_runtimes=False)
    for quadlet, docker, vllm_works in itertools.product(
        (False, True), (None, False, True), (None, False, True)
    ):
        runtimes = RuntimeFacts(
            podman=PodmanFacts(present=True, version="5.4.2", quadlet=quadlet),
            docker=DockerFacts(present=docker is not None, daemon_reachable=bool(docker)),
            vllm=None
            if vllm_works is None
            else HostVllmFacts(path="/v", present=vllm_works, error=None if vllm_works else "x"),
        )
        host = detected.model_copy(update={"runtimes": runtimes})
        picked = chosen_runtime(runtimes, vllm_given=False)
        try:
            planned, _ = choose_runtime(EndpointSpec(), host, tmp_path / "a.toml", runtimes.vllm)
        except Refusal:
            planned = None
        assert planned == picked, (quadlet, docker, vllm_works)
