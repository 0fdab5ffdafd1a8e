"""The real CPU vLLM and the tiny model the readiness tests serve (tests/tools/vllm_venv.sh).

Other test areas may import these: `vllm_executable()`, `tiny_model()`, `build_tiny_model()`,
`serve_argv()`, `vllm_env()`, `free_port()`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.machine import FORCE_STOCK, physical_cpus

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("EPYC_TEST_CACHE", "/var/cache/epyc-llm-test"))
VENV = CACHE / "vllm-venv"
TINY_MODEL = CACHE / "tiny-model"
STOCK_VLLM = CACHE / "stock-vllm"
BOOTSTRAP_HINT = "run tests/bootstrap.sh (it builds the vLLM CPU venv via tests/tools/vllm_venv.sh)"

HIDDEN_ZENTORCH = 'raise ImportError("zentorch hidden by the epyc-llm tests (stock vLLM)")\n'
WRAPPER = """#!/bin/sh
# vLLM of {venv} with zentorch hidden: vLLM falls back to its stock CpuPlatform.
PYTHONPATH={hide}${{PYTHONPATH:+:$PYTHONPATH}} exec {target} "$@"
"""


def real_vllm_executable() -> Path:
    """The venv's `vllm`; the test FAILS (never skips) when the venv has not been built."""
    vllm = VENV / "bin" / "vllm"
    if not vllm.is_file() or not (VENV / ".epyc-stamp").is_file():
        pytest.fail(f"no vLLM CPU venv in {VENV}: {BOOTSTRAP_HINT}")
    return vllm


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> None:
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.chmod(mode)
        partial.replace(path)


def stock_vllm_executable() -> Path:
    """The same real vLLM with zentorch hidden from its interpreter (a package that fails to
    import first on PYTHONPATH): what a venv without zentorch, or any non-AMD host, runs.
    `bin/vllm` and `bin/python` wrap the venv's, so the product's probe (the python beside
    the vllm) and the served process see the same platform."""
    real = real_vllm_executable()
    hide = STOCK_VLLM / "hide"
    _write_if_changed(hide / "zentorch" / "__init__.py", HIDDEN_ZENTORCH)
    for name, target in (("vllm", real), ("python", real.with_name("python"))):
        text = WRAPPER.format(venv=VENV, hide=hide, target=target)
        _write_if_changed(STOCK_VLLM / "bin" / name, text, 0o755)
    # the venv's own: the interpreter it runs is the one the product reads there, so a unit
    # hiding the homes (an interpreter under /root: pyenv) binds it back for the wrapper too
    _write_if_changed(STOCK_VLLM / "pyvenv.cfg", (VENV / "pyvenv.cfg").read_text())
    return STOCK_VLLM / "bin" / "vllm"


def vllm_executable() -> Path:
    """The vLLM the tests serve with: the real venv's, or its stock wrapper when forced."""
    return stock_vllm_executable() if FORCE_STOCK else real_vllm_executable()


@cache
def tiny_model_builder() -> ModuleType:
    path = REPO / "tests" / "tools" / "tiny_model.py"
    spec = importlib.util.spec_from_file_location("epyc_tiny_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def tiny_model() -> Path:
    """The cached default tiny model (built here if the bootstrap has not yet)."""
    return Path(tiny_model_builder().cached(TINY_MODEL))


def build_tiny_model(
    out: Path, *, chat_template: bool = True, broken_weights: bool = False
) -> Path:
    return Path(
        tiny_model_builder().build(out, chat_template=chat_template, broken_weights=broken_weights)
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def short_tmpdir() -> Path:
    """A TMPDIR for one vLLM server, removed when the test run ends. vLLM binds its ZMQ IPC
    sockets under TMPDIR, and a socket's path must fit in 107 bytes: a test's own tmp_path
    under a pytest-xdist worker (`.../pytest-N/popen-gw0/test_name0/tmp/UUID`) does not."""
    path = Path(tempfile.mkdtemp(prefix="vllm-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class ServingTest:
    """Whether the running test is marked `serves` (set by tests/conftest.py before each test).

    A real `vllm serve` takes most of the machine's two cores, so the tests that start one run
    one after another in the heavy xdist group; a test that would start one unmarked would
    run beside them instead, and both would wait on starved servers."""

    marked = False


def require_serves_marker() -> None:
    if not ServingTest.marked:
        pytest.fail(
            "this test starts a real `vllm serve` but is not marked `serves`: add "
            "pytest.mark.serves to it (tests/conftest.py runs those in the heavy group)"
        )


def vllm_env(work: Path) -> dict[str, str]:
    """The environment for serving on this CPU (every physical core bound; docs/sources.md,
    "Tools the tests run for real"), caches under `work`. Only a test marked `serves` may
    ask for it."""
    require_serves_marker()
    (work / "cache").mkdir(parents=True, exist_ok=True)
    return os.environ | {
        "VLLM_CACHE_ROOT": str(work / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "cache" / "inductor"),
        "TMPDIR": str(short_tmpdir()),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, physical_cpus())),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


def serve_argv(model: Path, port: int, served_model_name: str, *extra: str) -> list[str]:
    require_serves_marker()
    return [
        str(vllm_executable()),
        "serve",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "512",
        "--enforce-eager",
        *extra,
    ]


class VllmServer:
    """One real `vllm serve` in its own session, its output in a log file."""

    def __init__(self, argv: list[str], work: Path, env: dict[str, str] | None = None) -> None:
        """`env`: the server's whole environment (default `vllm_env(work)`)."""
        self.argv = argv
        self.log_path = work / "vllm.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env if env is not None else vllm_env(work),
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, base: str, within_s: float, poll_s: float = 1.0) -> None:
        """Until `base`/health answers 200; the test fails when the server exits first or
        `within_s` passes, with the end of its log. (llama-server's /health is 503 while it
        loads, vLLM's refuses the connection: both are "not yet".)"""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert self.alive(), self.log_text()[-3000:]
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    return
            time.sleep(poll_s)
        pytest.fail(f"{self.argv[0]} not healthy in {within_s}s: {self.log_text()[-3000:]}")

    def stop(self, timeout: float = 30) -> int:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self._log.close()
        return self.process.wait()
