"""Where epycd.conf is, without importing pydantic: `epycctl detect --root DIR` stays light
when there is nothing to validate."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

DEFAULT_CONFIG_DIR = Path("/etc/epyc-llm")
ENV_PREFIX = "EPYCD_"
EMBEDDED_RUNTIME = Path(sys.prefix) / "runtime"
"""Where `packaging/install.sh --runtime` (or, from the Debian package, its
/usr/share/epyc-llm/vllm-runtime.sh) provisions the embedded runtime (the validated host vLLM
stack, packaging/vllm-runtime.sh): beside the product's own venv, `/opt/epyc-llm/runtime`."""
PACKAGED_RUNTIME_RECIPE = Path("/usr/share/epyc-llm/vllm-runtime.sh")
"""The runtime recipe as the Debian package installs it (packaging/deb); install.sh keeps its
copy in the venv's share/epyc-llm and provisions with `install.sh --runtime` instead."""


def runtime_install_command(runtime_dir: Path, recipe: Path = PACKAGED_RUNTIME_RECIPE) -> str:
    """The command that provisions the embedded runtime in runtime_dir on this install: the
    Debian package's recipe (its build prerequisites from apt first) where the package is
    installed, else install.sh from a checkout. The recipe's venv is python3's, whose venv
    module the package does not bring where its own venv is python3.11's (Ubuntu 22.04)."""
    if recipe.is_file():
        return f"apt-get install g++ python3-dev python3-venv numactl && {recipe} {runtime_dir}"
    return "packaging/install.sh --runtime"


def daemon_conf_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(f"{ENV_PREFIX}CONFIG_DIR", DEFAULT_CONFIG_DIR)) / "epycd.conf"


def settings_given(environ: Mapping[str, str] | None = None) -> bool:
    """True when there is anything to validate: epycd.conf or an EPYCD_* variable."""
    env = os.environ if environ is None else environ
    named = any(key.upper().startswith(ENV_PREFIX) for key in env)
    return named or daemon_conf_path(env).exists()


def endpoint_status_file(run_dir: Path, name: str) -> Path:
    """The endpoint supervisor's status file, in a folder of the endpoint's own: its unit
    makes that folder (and nothing else of the run folder) writable for the endpoint's user."""
    return run_dir / "endpoints" / name / "status.json"


DAEMON_STATUS_FILE = "status.json"
"""epycd's own status in RUN_DIR: its pid and every endpoint's status, with the serving
instances' load (`epycd.status.daemon_file` reads it for `epycctl status NAME`)."""


def gateway_approval_file(state_dir: Path) -> Path:
    """The gateway's approval record (written by epycd.gateway.apply), read below the
    gateway's layer by the address book (epycd.plan.placement.reservations)."""
    return state_dir / "gateway" / "approval.json"
