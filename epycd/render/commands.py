"""The argument vectors the units run, before any quoting: the same lists feed every path."""

from __future__ import annotations

from epycd.engines import DEFAULT_ENGINE, engine_named
from epycd.host.cpulist import format_cpulist
from epycd.listen import local_url
from epycd.plan.model import AnyServer

TOKEN_CREDENTIAL = "hf_token"
API_KEY_CREDENTIAL = "api_key"


def base_url(decisions: AnyServer) -> str:
    return local_url(decisions.host, decisions.port)


def gate_timeout(decisions: AnyServer) -> int:
    """The gate's own bound, inside TimeoutStartSec so the gate, not systemd, reports it."""
    return max(decisions.start_timeout_s - min(60, decisions.start_timeout_s // 10), 1)


def gate_width(decisions: AnyServer) -> list[str]:
    """The width an embeddings endpoint's gate checks each vector for, where the plan knows
    it."""
    width = decisions.embedding_width
    return [] if width is None else ["--embedding-width", str(width)]


def supervisor(decisions: AnyServer, server: list[str]) -> list[str]:
    argv = [
        decisions.product_python,
        "-m",
        "epycd.supervisor",
        "--name",
        decisions.endpoint,
        "--url",
        base_url(decisions),
        "--served-model-name",
        decisions.served_model_name,
        "--endpoint",
        decisions.primary_endpoint,
        "--load-timeout",
        str(gate_timeout(decisions)),
    ]
    argv += gate_width(decisions)
    if decisions.status_file:
        argv += ["--status-file", decisions.status_file]
    if decisions.api_key_file:
        argv += ["--api-key-credential", API_KEY_CREDENTIAL]
        key_env = engine_named(decisions.engine).api_key_env
        if key_env != DEFAULT_ENGINE.api_key_env:  # the supervisor's default
            argv += ["--api-key-env", key_env]
    if decisions.healing is not None:
        argv += ["--stall-timeout", str(decisions.healing.stall_s)]
    return [*argv, "--", *server]


def numa_list(decisions: AnyServer) -> str:
    return format_cpulist(decisions.numa_nodes)
