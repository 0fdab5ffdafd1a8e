"""vLLM's argument vectors, before any quoting: `vllm serve` in a container (its key read
by `KEY_LAUNCHER`) or on the host, the container's env, mounts and flags, `docker run`, and
the podman health check's probe."""

from __future__ import annotations

from epycd.engines.vllm.plan.model import AnyVllmServer
from epycd.engines.vllm.render.policy import REQUIRED_RUN_FLAGS
from epycd.render.commands import (
    API_KEY_CREDENTIAL,
    base_url,
    gate_timeout,
    gate_width,
    numa_list,
)

TOKEN_IN_CONTAINER = "/run/secrets/hf_token"
API_KEY_IN_CONTAINER = "/run/secrets/api_key"
DOCKER = "docker"
CONTAINER_CONFINEMENT = ("--cap-drop=ALL", "--security-opt=no-new-privileges")
"""vLLM in a container needs one capability, SYS_NICE (NUMA binding: mbind/migrate_pages of
the pinned memory), and never gains another (no setuid in the image counts). Quadlet writes
the same from DropCapability=all and NoNewPrivileges=true."""
KEY_LAUNCHER = (
    "import os, sys; "
    "os.environ['VLLM_API_KEY'] = open(sys.argv[1], encoding='utf-8').read().strip(); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)
"""Inside a container: read the mounted key file into VLLM_API_KEY, then become `vllm`.
The key stays out of the unit, the argv and `podman/docker inspect`."""


def vllm_serve_in_container(decisions: AnyVllmServer) -> list[str]:
    """The container's command; with an API key, the launcher runs `vllm serve` (and replaces
    an image entrypoint that is `vllm serve` itself: see `entrypoint_flags`)."""
    if decisions.api_key_file:
        launcher = ["-c", KEY_LAUNCHER, API_KEY_IN_CONTAINER, "vllm", "serve"]
        python = [] if decisions.image_entrypoint_is_vllm_serve else ["python3"]
        return [*python, *launcher, *decisions.vllm_args]
    prefix = [] if decisions.image_entrypoint_is_vllm_serve else ["vllm", "serve"]
    return [*prefix, *decisions.vllm_args]


def entrypoint_flags(decisions: AnyVllmServer) -> list[str]:
    if decisions.api_key_file and decisions.image_entrypoint_is_vllm_serve:
        return ["--entrypoint=python3"]
    return []


def vllm_serve_on_host(decisions: AnyVllmServer) -> list[str]:
    assert decisions.vllm_executable is not None
    return [decisions.vllm_executable, "serve", *decisions.vllm_args]


def health_gate(decisions: AnyVllmServer) -> list[str]:
    return [
        decisions.product_python,
        "-m",
        "epycd.health",
        "--url",
        base_url(decisions),
        "--served-model-name",
        decisions.served_model_name,
        "--endpoint",
        decisions.primary_endpoint,
        *gate_width(decisions),
        "--timeout",
        str(gate_timeout(decisions)),
        *(["--api-key-credential", API_KEY_CREDENTIAL] if decisions.api_key_file else []),
    ]


def health_probe(decisions: AnyVllmServer) -> str:
    """podman's --health-cmd in exec (JSON array) form: Python's urllib, no curl, no shell."""
    code = f"import urllib.request as r; r.urlopen('{base_url(decisions)}/health', timeout=5)"
    return f'["python3", "-c", "{code}"]'


def container_env(decisions: AnyVllmServer) -> list[tuple[str, str]]:
    env = dict(decisions.env)
    if decisions.hf_token_file:
        env["HF_TOKEN_PATH"] = TOKEN_IN_CONTAINER
    return sorted(env.items())


def ulimit_flags(decisions: AnyVllmServer) -> list[str]:
    """The unit's limits inside the container: the engine, not systemd, sets a container's
    rlimits (docs/tuning.md rule 5)."""
    memlock = "-1" if decisions.limit_memlock == "infinity" else decisions.limit_memlock
    return [
        f"--ulimit=nofile={decisions.limit_nofile}:{decisions.limit_nofile}",
        f"--ulimit=memlock={memlock}:{memlock}",
    ]


def extra_run_flags(decisions: AnyVllmServer) -> list[str]:
    extra = [flag for flag in decisions.run_flags if flag not in REQUIRED_RUN_FLAGS]
    return [*extra, *entrypoint_flags(decisions)]


def container_mounts(decisions: AnyVllmServer) -> list[str]:
    """`-v`/`Volume=` values: HOST:CONTAINER[:ro]."""
    mounts = []
    if decisions.hf_cache:
        mounts.append(f"{decisions.hf_cache.host_path}:{decisions.hf_cache.container_path}")
    for mount in decisions.extra_mounts:
        ro = ":ro" if mount.read_only else ""
        mounts.append(f"{mount.host_path}:{mount.container_path}{ro}")
    if decisions.hf_token_file:
        mounts.append(f"{decisions.hf_token_file}:{TOKEN_IN_CONTAINER}:ro")
    if decisions.api_key_file:
        mounts.append(f"{decisions.api_key_file}:{API_KEY_IN_CONTAINER}:ro")
    return mounts


def docker_run(decisions: AnyVllmServer) -> list[str]:
    """`--pull=never` (docker >= 20.10), as Quadlet's `Pull=never`: approve pulls; a start
    never waits on a registry nor takes a newer image under the approved tag."""
    assert decisions.image is not None
    argv = [
        DOCKER,
        "run",
        "--rm",
        "--pull=never",
        "--name",
        decisions.unit_name,
        *REQUIRED_RUN_FLAGS,
        *CONTAINER_CONFINEMENT,
        f"--cpuset-cpus={decisions.cpus}",
        f"--cpuset-mems={numa_list(decisions)}",
        *ulimit_flags(decisions),
        *extra_run_flags(decisions),
    ]
    for mount in container_mounts(decisions):
        argv += ["-v", mount]
    for name, value in container_env(decisions):
        argv += ["-e", f"{name}={value}"]
    return [*argv, decisions.image, *vllm_serve_in_container(decisions)]
