from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started; any still running at the end get SIGTERM, then SIGKILL."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
        if process.poll() is None:
            process.kill()
            process.wait()
