"""What a rendered unit must hand its processes, checked against a real systemd's runs."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from epycd.engines.vllm.plan.model import AnyVllmServer
from epycd.engines.vllm.plan.tuning import omp_bind
from epycd.engines.vllm.render.commands import (
    DOCKER,
    container_env,
    container_mounts,
    docker_run,
    health_gate,
    health_probe,
    vllm_serve_in_container,
    vllm_serve_on_host,
)
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.render.commands import TOKEN_CREDENTIAL, supervisor
from epycd.render.parts import describe
from epycd.render.sandbox import STATIC_DIRECTIVES
from tests.render.manager import Run, UserManager

PODMAN = "/usr/bin/podman"


def on_this_machine(decisions: AnyVllmServer, manager: UserManager) -> AnyVllmServer:
    """Executables replaced by the argv dumper; pinned to CPUs and node 0 of this machine."""
    cpus = format_cpulist(os.sched_getaffinity(0))
    bind = format_cpulist(omp_bind(list(os.sched_getaffinity(0))))
    dumper = str(manager.dumper)
    update: dict[str, object] = {
        "product_python": dumper,
        "exec_condition": [[dumper, *argv[1:]] for argv in decisions.exec_condition],
        "cpus": cpus,
        "numa_nodes": [0],
        "omp_cpus": bind,
        "env": {**decisions.env, "VLLM_CPU_OMP_THREADS_BIND": bind},
    }
    if decisions.vllm_executable:
        update["vllm_executable"] = dumper
    return decisions.model_copy(update=update)


def runnable_generated(text: str, manager: UserManager) -> str:
    """Quadlet's service with podman swapped: `run` goes to the dumper, `rm` to /bin/true.
    The dumper exits 0 once it has recorded its argv, which `RestartForceExitStatus=0` would
    restart as a server that ended by itself: one run is what is checked here."""
    text = text.replace(f"ExecStart={PODMAN} ", f"ExecStart={manager.dumper} ")
    text = text.replace("\nRestartForceExitStatus=0\n", "\n")
    return text.replace(PODMAN, "/bin/true")


def runnable_docker(text: str) -> str:
    """The docker service without its `docker rm -f` pre-step (no docker daemon is touched)."""
    return text.replace(f"ExecStartPre=-{DOCKER} ", "ExecStartPre=-/bin/true ")


def refused_here(manager: UserManager) -> frozenset[str]:
    """The sandbox directives this machine's kernel setup refuses (226/NAMESPACE): a test
    machine that is itself a container may not let systemd remount /proc/sys or hide
    /proc/kmsg. Each is tried alone on a oneshot unit, once per manager."""
    if manager.refused is None:
        refused = set()
        for key, value in STATIC_DIRECTIVES:
            unit = f"[Service]\nType=oneshot\nExecStart=/bin/true\n{key}={value}\n"
            manager.install({"epyc-probe.service": unit})
            manager.systemctl("start", "epyc-probe.service", check=False)
            status = manager.systemctl("show", "epyc-probe.service", "-p", "ExecMainStatus")
            if status.strip() != "ExecMainStatus=0":
                refused.add(f"{key}={value}")
            manager.systemctl("reset-failed", "epyc-probe.service", check=False)
        manager.refused = frozenset(refused)
    return manager.refused


MOUNT_NAMESPACE_KEYS = (
    "ProtectSystem=",
    "ProtectHome=",
    "PrivateDevices=",
    "PrivateMounts=",
    "PrivateIPC=",
    "ProtectControlGroups=",
    "ProtectKernelModules=",
    "ProtectProc=",
    "ReadWritePaths=",
)
"""What gives a unit a mount namespace. systemd 252's user manager, run here, stops
starting Type=notify units for good after one with LoadCredential= ran in a mount namespace
(the start job succeeds and runs nothing); the system manager (tests/e2e) has no such bug."""


def runnable_sandboxed(text: str, manager: UserManager) -> str:
    """The sandboxed units as this harness can run them; every other directive stays.

    The harness (the dumper, its output folder) lives under /tmp, which PrivateTmp= would
    hide and ProtectSystem=strict makes read-only: /tmp stays shared and the output folder
    writable. The user manager has no user epyc-llm, so the unit runs as the manager's
    user; what this machine refuses (`refused_here`) is left out, and so is the mount
    namespace of a unit with credentials (MOUNT_NAMESPACE_KEYS): tests/e2e runs the real
    units whole, as epyc-llm, under systemd as PID 1."""
    refused = refused_here(manager)
    dropped: tuple[str, ...] = ("User=", "Group=", "PrivateTmp=")
    if "\nLoadCredential=" in text:
        dropped += MOUNT_NAMESPACE_KEYS
    kept = [
        line for line in text.splitlines() if not line.startswith(dropped) and line not in refused
    ]
    out = "\n".join(kept) + "\n"
    if "ProtectSystem=strict" in out:
        out = out.replace("\n[Service]\n", f"\n[Service]\nReadWritePaths={manager.dumps}\n", 1)
    return out


def _main(run: Run, marker: list[str]) -> dict[str, object]:
    found = [r for r in run.records if r["argv"][1 : 1 + len(marker)] == marker]
    assert len(found) == 1, f"expected one {marker} run, got {[r['argv'] for r in run.records]}"
    return found[0]


def _common(decisions: AnyVllmServer, run: Run) -> None:
    assert run.result == "success", run
    assert run.description == describe(decisions)
    argvs = [r["argv"] for r in run.records]
    for argv in decisions.exec_condition:
        assert argv in argvs
    memlock = -1 if decisions.limit_memlock == "infinity" else int(decisions.limit_memlock)
    nofile = _as_allowed(decisions.limit_nofile, resource.RLIMIT_NOFILE)
    memlock = _as_allowed(memlock, resource.RLIMIT_MEMLOCK)
    for record in run.records:
        assert record["nofile"] == [nofile, nofile], (record["argv"], record["nofile"])
        assert record["memlock"] == [memlock, memlock], (record["argv"], record["memlock"])


def _as_allowed(limit: int, which: int) -> int:
    """systemd lowers a Limit*= to the manager's own hard limit when it may not raise it (a
    container running the tests): the manager inherits this process's hard limit."""
    hard = resource.getrlimit(which)[1]
    if hard == resource.RLIM_INFINITY:
        return limit
    return hard if limit == resource.RLIM_INFINITY or limit > hard else limit


def check_service(decisions: AnyVllmServer, run: Run) -> None:
    _common(decisions, run)
    record = _main(run, ["-m", "epycd.supervisor"])
    if decisions.runtime == "docker":
        server = docker_run(decisions)
    else:
        server = vllm_serve_on_host(decisions)
    assert record["argv"] == supervisor(decisions, server)
    if decisions.runtime == "host":
        env = record["env"]
        assert isinstance(env, dict)
        for name, value in decisions.env.items():
            assert env.get(name) == value, name
        if decisions.hf_cache:
            assert env.get("HF_HOME") == decisions.hf_cache.host_path
        assert record["cpus"] == parse_cpulist(decisions.cpus)
        if decisions.hf_token_file:
            expected = os.path.join(env["CREDENTIALS_DIRECTORY"], TOKEN_CREDENTIAL)
            assert env["HF_TOKEN_PATH"] == expected
    if decisions.api_key_file:
        _has_key_credential(record)


def _has_key_credential(record: dict[str, object]) -> None:
    """The process was handed the API key as a credential, and nothing else carries it."""
    env = record["env"]
    assert isinstance(env, dict) and "CREDENTIALS_DIRECTORY" in env
    assert "VLLM_API_KEY" not in env
    assert "--api-key-credential" in record["argv"]  # type: ignore[operator]


def _values_after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def check_container(decisions: AnyVllmServer, run: Run) -> None:
    _common(decisions, run)
    record = _main(run, ["run"])
    argv = record["argv"]
    assert isinstance(argv, list)
    assert decisions.image is not None
    tail = [decisions.image, *vllm_serve_in_container(decisions)]
    assert argv[-len(tail) :] == tail
    assert _values_after(argv, "--name") == [decisions.unit_name]
    expected_env = sorted(f"{k}={v}" for k, v in container_env(decisions))
    assert sorted(_values_after(argv, "--env")) == expected_env
    assert _values_after(argv, "-v") == container_mounts(decisions)
    memlock = "-1" if decisions.limit_memlock == "infinity" else decisions.limit_memlock
    for flag in (
        "--ipc=host",
        f"--cpuset-cpus={decisions.cpus}",
        "--cpuset-mems=0",
        f"--ulimit=nofile={decisions.limit_nofile}:{decisions.limit_nofile}",
        f"--ulimit=memlock={memlock}:{memlock}",
    ):
        assert flag in argv
    if decisions.api_key_file:
        assert "VLLM_API_KEY" not in " ".join(argv[: -len(tail)])
        entrypoint = "--entrypoint=python3" in argv
        assert entrypoint == decisions.image_entrypoint_is_vllm_serve
    if decisions.podman_notify_healthy:
        assert "--sdnotify=healthy" in argv
        assert _values_after(argv, "--health-cmd") == [health_probe(decisions)]
    else:
        gate = _main(run, ["-m", "epycd.health"])
        assert gate["argv"] == health_gate(decisions)
        if decisions.api_key_file:
            _has_key_credential(gate)


def token_file(folder: Path) -> str:
    path = folder / "hf.token"
    path.write_text("hf_secret_for_tests\n")
    path.chmod(0o600)
    return str(path)


def key_file(folder: Path) -> str:
    path = folder / "api.key"
    path.write_text("key-for-tests\n")
    path.chmod(0o600)
    return str(path)


def with_real_secrets(decisions: AnyVllmServer, folder: Path) -> AnyVllmServer:
    """The fixture's secret files replaced by root-only files that exist here."""
    update: dict[str, object] = {}
    if decisions.hf_token_file:
        update["hf_token_file"] = token_file(folder)
    if decisions.api_key_file:
        update["api_key_file"] = key_file(folder)
    return decisions.model_copy(update=update)
