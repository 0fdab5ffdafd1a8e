"""The server process under a supervisor: started without the manager's variables, its last
lines and first error kept, stopped with its process group; watchdog pings while a
condition holds."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import IO, BinaryIO

from epycd.health import (
    API_KEY_ENV,
)
from epycd.notify import Notifier

LOG_TAIL_LINES = 40
ERROR_CONTEXT_LINES = 8
EXCEPTION_LINE = re.compile(r"(^|[\s.])[A-Z]\w*(Error|Exception)(:\s|$)")
"""A traceback's last line: `ValueError: ...`, also qualified (`safetensors_rust.SafetensorError:
...`, the error of weights vLLM cannot load) and behind vLLM's process prefix."""
MANAGER_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class LogTail:
    """Copies a child's output through and keeps its last lines and its first exception."""

    def __init__(self, lines: int = LOG_TAIL_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._recent: deque[str] = deque(maxlen=ERROR_CONTEXT_LINES)
        self._first_error: list[str] = []
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    def follow(self, source: IO[bytes], sink: BinaryIO) -> None:
        pump = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
        pump.start()
        self._pumps.append(pump)

    def _pump(self, source: IO[bytes], sink: BinaryIO) -> None:
        for raw in iter(source.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                sink.write(raw)
                sink.flush()
            self._keep(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        source.close()

    def _keep(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            self._recent.append(line)
            if not self._first_error and EXCEPTION_LINE.search(line.strip()):
                self._first_error = list(self._recent)

    def drain(self, timeout: float = 5.0) -> None:
        for pump in self._pumps:
            pump.join(timeout)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def first_error(self) -> list[str]:
        with self._lock:
            return list(self._first_error)


def server_env(api_key: str | None = None, key_env: str = API_KEY_ENV) -> dict[str, str]:
    """The server must not talk to the service manager itself: the supervisor does. The API
    key reaches the server in `key_env` (vLLM's VLLM_API_KEY, llama-server's LLAMA_API_KEY),
    never through its argv."""
    env = {key: value for key, value in os.environ.items() if key not in MANAGER_ENV}
    if api_key:
        env[key_env] = api_key
    return env


def start_server(
    argv: Sequence[str], tail: LogTail, api_key: str | None = None, key_env: str = API_KEY_ENV
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server_env(api_key, key_env),
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    tail.follow(process.stdout, sys.stdout.buffer)
    tail.follow(process.stderr, sys.stderr.buffer)
    return process


def wait_for_exit(process: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Sleeps until the process exits or `timeout` passes; True when it has exited."""
    if process.poll() is not None:
        return True
    with contextlib.closing(_pidfd(process.pid)) as pidfd:
        select.select([pidfd], [], [], timeout)
    return process.poll() is not None


class _ClosableFd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        os.close(self.fd)


def _pidfd(pid: int) -> _ClosableFd:
    return _ClosableFd(os.pidfd_open(pid))


def stop_server(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM to the server's process group, SIGKILL after `timeout`; its exit status."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            if wait_for_exit(process, wait):
                break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


@contextlib.contextmanager
def pings_while(
    notifier: Notifier, interval: float | None, alive: Callable[[], bool]
) -> Iterator[None]:
    """WATCHDOG=1 every `interval` seconds from a thread, as long as `alive()`, for the
    duration of the block (the health gate: loading is bounded by TimeoutStartSec=)."""
    if interval is None:
        yield
        return
    done = threading.Event()

    def ping() -> None:
        while alive():
            notifier.watchdog()
            if done.wait(interval):
                return

    thread = threading.Thread(target=ping, name="watchdog-while-loading", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
