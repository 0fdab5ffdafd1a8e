"""The container's key launcher, run for real: it reads the mounted key file into
VLLM_API_KEY and becomes the command after it, with the key in no argv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from epycd.engines.vllm.render.commands import (
    API_KEY_IN_CONTAINER,
    KEY_LAUNCHER,
    container_env,
    vllm_serve_in_container,
)
from tests.render.fixtures import docker_exposed_with_key, podman_before_5_with_key
from tests.sandbox import run_python


def test_the_launcher_hands_the_key_to_the_command_it_becomes(tmp_path: Path) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text("s3cr3t-k3y\n")
    show = "import os, sys; print(os.environ['VLLM_API_KEY'], os.getpid(), sys.argv[1:])"
    argv = ["-c", KEY_LAUNCHER, str(key_file), sys.executable, "-c", show, "serve"]
    done = run_python(argv, env=os.environ)
    assert done.returncode == 0, done.stderr
    key, _pid, rest = done.stdout.split(" ", 2)
    assert key == "s3cr3t-k3y" and rest.strip() == "['serve']"


def test_the_container_command_runs_vllm_serve_through_the_launcher() -> None:
    for decisions in (podman_before_5_with_key(), docker_exposed_with_key()):
        command = vllm_serve_in_container(decisions)
        at = command.index(API_KEY_IN_CONTAINER)
        assert command[at + 1 : at + 3] == ["vllm", "serve"]
        assert command[at + 3 :] == decisions.vllm_args
        assert all(name != "VLLM_API_KEY" for name, _ in container_env(decisions))
