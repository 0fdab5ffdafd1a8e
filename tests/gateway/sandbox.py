"""The gateway's tests' sandbox: tests/approval's, with the state folder where only root
controls the path (the key store is root's alone, as a key file is: a path under /tmp is
refused) and the real HAProxy of the test cache as the one the gateway runs and checks its
configuration with (`gateway_haproxy`: a script that runs the cached binary)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.approval.conftest import ApprovalSandbox, make_env
from tests.render.test_balancer import cached_haproxy
from tests.sandbox import make_executable
from tests.secrets import root_folder


def haproxy_script(folder: Path) -> Path:
    """A script that runs the test cache's HAProxy with its libraries, as /usr/sbin/haproxy
    would run."""
    binary, env = cached_haproxy()
    exports = " ".join(f"{name}={value}" for name, value in env.items())
    return make_executable(folder / "haproxy", f'#!/bin/sh\n{exports} exec {binary} "$@"\n')


@contextlib.contextmanager
def gateway_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApprovalSandbox]:
    sandbox = make_env(tmp_path, monkeypatch)
    with root_folder() as root:
        state = root / "state"
        state.mkdir(mode=0o755)
        sandbox.vars["EPYCD_STATE_DIR"] = str(state)
        sandbox.vars["EPYCD_GATEWAY_HAPROXY"] = str(haproxy_script(sandbox.bin_dir))
        for name in ("EPYCD_STATE_DIR", "EPYCD_GATEWAY_HAPROXY"):
            monkeypatch.setenv(name, sandbox.vars[name])
        yield sandbox
