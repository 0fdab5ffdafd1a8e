"""The one way the product runs a probe: a short-lived child asked a question (`llama-server
--version`, a venv's interpreter importing vLLM, `podman --version`, amd-smi, ...).

What runs may be anything an endpoint file or the PATH names, so both what it prints and
how long it is waited for are bounded: `run_bounded` reads at most `max_bytes` of each of
its stdout and stderr (a child printing more is killed: 1.5 GB of `--version` is not an
answer), gives up at the timeout (the child's process group is killed), and stops reading
once the child itself has exited, after a short grace, even if a grandchild it left behind
(a daemon) still holds the pipes open: `subprocess.run` would wait for that grandchild until
the timeout, on every plan.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

MAX_OUTPUT_BYTES = 64 * 1024
"""A probe's answer is a version line or a small JSON document: a few hundred bytes."""
EXIT_GRACE_S = 0.2
"""How long the pipes are still read once the child has exited (what it wrote is already
in the pipe; only a grandchild could write more)."""
POLL_S = 0.05
"""How often the child is checked for having exited while it writes nothing."""


class OutputTooLarge(subprocess.SubprocessError):
    """The child printed more than the bound; it was killed."""

    def __init__(self, argv: Sequence[str], max_bytes: int) -> None:
        super().__init__(f"{argv[0]} printed more than {max_bytes} bytes")
        self.argv = list(argv)
        self.max_bytes = max_bytes


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """The child and what it started in its session, then the child reaped."""
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        process.kill()
    process.wait()


def read_until_exit(
    process: subprocess.Popen[bytes],
    argv: Sequence[str],
    deadline: float,
    max_bytes: int,
    until: Callable[[bytearray], bool] | None = None,
) -> tuple[dict[int, bytearray], bool]:
    """What the child wrote on each pipe (by fd), read until both close or, once the child
    has exited, for `EXIT_GRACE_S` more, or until what a pipe holds satisfies `until` (then
    True beside it). TimeoutExpired past `deadline`, OutputTooLarge past `max_bytes` on a
    pipe."""
    pipes: list[IO[bytes]] = [pipe for pipe in (process.stdout, process.stderr) if pipe]
    read: dict[int, bytearray] = {pipe.fileno(): bytearray() for pipe in pipes}
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for pipe in pipes:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > EXIT_GRACE_S:
                break  # a grandchild holds the pipes: what the child said is read
            if now >= deadline:
                raise subprocess.TimeoutExpired(list(argv), 0)
            for key, _events in selector.select(min(deadline - now, POLL_S)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                read[key.fd] += chunk
                if len(read[key.fd]) > max_bytes:
                    raise OutputTooLarge(argv, max_bytes)
                if until is not None and until(read[key.fd]):
                    return read, True
    return read, False


def run_bounded(
    argv: Sequence[str],
    *,
    timeout: float,
    max_bytes: int = MAX_OUTPUT_BYTES,
    env: Mapping[str, str] | None = None,
    until: Callable[[bytearray], bool] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` (stdin /dev/null, its own session) and return its exit code and output
    as text, within `timeout` seconds in all and `max_bytes` per stream. OSError when it
    cannot start; subprocess.TimeoutExpired or OutputTooLarge (both SubprocessError) when
    it goes past a bound, its process group killed. Where what one stream holds satisfies
    `until`, the answer is in: the group is killed then (a server asked only its first
    words), and the exit code is the kill's."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    deadline = started + timeout
    assert process.stdout is not None and process.stderr is not None
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    try:
        read, answered = read_until_exit(process, argv, deadline, max_bytes, until)
        if answered:
            kill_group(process)
        code = process.wait(max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        kill_group(process)
        raise subprocess.TimeoutExpired(list(argv), timeout) from None
    except BaseException:
        kill_group(process)
        raise
    finally:
        process.stdout.close()
        process.stderr.close()
    return subprocess.CompletedProcess(list(argv), code, text(read[out_fd]), text(read[err_fd]))


def text(data: bytes | bytearray) -> str:
    """The output as text, never failing on bytes that are not UTF-8."""
    return data.decode("utf-8", errors="replace")
