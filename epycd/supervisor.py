"""The endpoint supervisor: the main process of a `Type=notify` unit (host and docker paths).

    python -m epycd.supervisor --name NAME --url http://127.0.0.1:PORT \\
        --served-model-name ID --endpoint chat_completions \\
        [--api-key-file F | --api-key-credential NAME] \\
        [--status-file PATH] -- <server argv...>

It starts the server (its output passes through to the journal; the last lines are kept
for failure reports), runs the health gate, then tells systemd `READY=1` with a `STATUS=`.
With `WatchdogSec=` (issue 27, docs/healing.md) it pings `WATCHDOG=1` at half of
`WATCHDOG_USEC`: while loading as long as the server process lives (the start is bounded by
`TimeoutStartSec=`, not by the watchdog), and after READY only while `/health` answers
within its timeout and the engine is not stalled (requests running and vLLM's token
counters in `/metrics` still for `--stall-timeout` seconds). When it stops pinging it logs
one line saying why and keeps the reason in the status file (`unhealthy`), so that the
crash recorder (`epycd.approval.crashloop`) can name it after the watchdog killed the unit.
It forwards SIGTERM/SIGINT to the server and exits with the server's status. When the gate
fails it logs the phase, the reason and the server's last lines, keeps them in the status
file for `epycctl status`, stops the server and exits 1. No retry: systemd's Restart=
restarts the unit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, BinaryIO, Literal

import click
import httpx
from pydantic import BaseModel, Field

from epycd.health import (
    API_KEY_ENV,
    GateConfig,
    GateResult,
    PrimaryEndpoint,
    StallWatch,
    auth_headers,
    credential_path,
    health_problem,
    read_api_key,
    read_progress,
    run_gate,
)
from epycd.notify import Notifier, watchdog_interval
from epycd.readfile import STATE_MAX_BYTES, read_bytes

LOG_TAIL_LINES = 40
ERROR_CONTEXT_LINES = 8
EXCEPTION_LINE = re.compile(r"(^|[\s.])[A-Z]\w*(Error|Exception)(:\s|$)")
"""A traceback's last line: `ValueError: ...`, also qualified (`safetensors_rust.SafetensorError:
...`, the error of weights vLLM cannot load) and behind vLLM's process prefix."""
GATE_FAILED_EXIT = 1
DEFAULT_STALL_TIMEOUT_S = 120.0
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
WATCHDOG_SIGNAL = signal.SIGABRT
"""systemd's default WatchdogSignal=: the supervisor records why and kills the server."""
MANAGER_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

log = logging.getLogger("epycd.supervisor")

SupervisorState = Literal["starting", "ready", "failed", "stopped"]


class SupervisorStatus(BaseModel):
    """What the status file holds; `phase` is a gate phase, or "serving" after READY.

    "stopped" is written when the supervisor was asked to stop (SIGTERM/SIGINT) and the
    server has exited; `reason` then carries the server's exit status.
    """

    state: SupervisorState
    name: str
    url: str
    model: str
    phase: str | None = None
    reason: str = ""
    log_tail: list[str] = Field(default_factory=list)
    first_error: list[str] = Field(
        default_factory=list,
        description="the server's first exception line and the lines before it: the root "
        "cause is often far above the tail",
    )
    seconds: dict[str, float] = Field(default_factory=dict)
    unhealthy: str | None = Field(
        default=None,
        description="state ready: why the supervisor stopped pinging the watchdog (health not "
        "answering, engine stalled); systemd kills the unit unless it recovers",
    )
    pid: int | None = Field(default=None, description="the server's process id")
    since: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


class SupervisorOptions(BaseModel):
    name: str
    gate: GateConfig
    status_file: Path | None = None
    stop_timeout: float = 30.0
    stall_timeout: float = DEFAULT_STALL_TIMEOUT_S


def read_status(path: Path) -> SupervisorStatus | None:
    """The status a supervisor last wrote, or None when there is none (yet)."""
    try:
        return SupervisorStatus.model_validate_json(read_bytes(path, STATE_MAX_BYTES))
    except (OSError, ValueError):
        return None  # none, or not one a supervisor wrote (a FIFO, a folder, huge, damaged)


STATUS_FILE_MODE = 0o644
"""`epycctl status` is for every user; the unit's UMask=0077 would make the file root's."""


def write_status(path: Path | None, status: SupervisorStatus) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(status.model_dump_json(indent=2) + "\n", encoding="utf-8")
    partial.chmod(STATUS_FILE_MODE)
    partial.replace(path)


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


def server_env(api_key: str | None = None) -> dict[str, str]:
    """The server must not talk to the service manager itself: the supervisor does. The API
    key reaches vLLM here, never through its argv."""
    env = {key: value for key, value in os.environ.items() if key not in MANAGER_ENV}
    if api_key:
        env[API_KEY_ENV] = api_key
    return env


def start_server(
    argv: Sequence[str], tail: LogTail, api_key: str | None = None
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=server_env(api_key),
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


class ServingChecks:
    """What must hold after READY for each WATCHDOG=1: /health answers within its timeout
    and the engine is not stalled. An unreadable /metrics alone never stops the pings."""

    def __init__(self, gate: GateConfig, interval: float, stall_timeout: float) -> None:
        self.client = httpx.Client(base_url=gate.url, headers=auth_headers(gate.api_key))
        self.health_timeout = min(gate.health_timeout, interval / 2)
        self.metrics_timeout = min(gate.health_timeout, interval / 4)
        self.stall = StallWatch(stall_timeout)
        self.healthy_at = time.monotonic()
        self.metrics_error: str | None = None

    def close(self) -> None:
        self.client.close()

    def problem(self) -> str | None:
        """None when the watchdog may be pinged; else why not, as one line."""
        answer = health_problem(self.client, self.health_timeout)
        now = time.monotonic()
        if answer is not None:
            return f"health not answering for {now - self.healthy_at:.0f} s ({answer})"
        self.healthy_at = now
        try:
            progress = read_progress(self.client, self.metrics_timeout)
        except ValueError as error:
            if self.metrics_error is None:
                log.warning(
                    "cannot read the engine's progress (%s); the watchdog follows /health "
                    "alone until it can",
                    error,
                )
            self.metrics_error = str(error)
            return self.stall.stalled(None)
        return self.stall.stalled(progress)


class Supervisor:
    def __init__(self, options: SupervisorOptions, argv: Sequence[str]) -> None:
        self.options = options
        self.argv = list(argv)
        self.notifier = Notifier()
        self.tail = LogTail()
        self.stop_signal: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.unhealthy: str | None = None
        self.seconds: dict[str, float] = {}

    def status(self, state: SupervisorState, **fields: object) -> SupervisorStatus:
        return SupervisorStatus.model_validate(
            {
                "state": state,
                "name": self.options.name,
                "url": self.options.gate.url,
                "model": self.options.gate.served_model_name,
                "pid": self.process.pid if self.process else None,
                **fields,
            }
        )

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_signal = signum
        self.notifier.stopping(f"stopping {self.options.gate.served_model_name}")
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def on_watchdog(self, signum: int, _frame: FrameType | None) -> None:
        """systemd's watchdog fired (WatchdogSignal=SIGABRT, its default): keep why in the
        status file, kill the server's process group (a hung engine does not stop on
        SIGTERM) and die without a core dump."""
        why = self.unhealthy or "no WATCHDOG=1 in time"
        reason = f"killed by systemd's watchdog (signal {signum}): {why}"
        log.error("%s", reason)
        with contextlib.suppress(Exception):
            write_status(
                self.options.status_file,
                self.status(
                    "failed",
                    phase="watchdog",
                    reason=reason,
                    log_tail=self.tail.lines(),
                    first_error=self.tail.first_error(),
                    seconds=self.seconds,
                ),
            )
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        os._exit(128 + signum)

    def server_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and not self.stop_signal

    def run(self) -> int:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self.on_signal)
        signal.signal(WATCHDOG_SIGNAL, self.on_watchdog)
        gate = self.options.gate
        try:
            self.process = start_server(self.argv, self.tail, gate.api_key)
        except OSError as exc:
            return self.cannot_start(exc)
        log.info("started server pid %d: %s", self.process.pid, " ".join(self.argv))
        if self.stop_signal is not None:
            os.kill(self.process.pid, self.stop_signal)
        write_status(self.options.status_file, self.status("starting", phase="health"))
        self.notifier.status(f"loading {gate.served_model_name}, waiting for {gate.url}/health")
        with pings_while(self.notifier, watchdog_interval(), self.server_alive):
            result = run_gate(gate, self.server_alive)
        self.seconds = result.seconds
        if self.stop_signal is not None:
            return self.finish(self.process.wait())
        if not result.ok:
            return self.gate_failed(result)
        text = f"serving {gate.served_model_name} on {gate.url}"
        write_status(
            self.options.status_file, self.status("ready", phase="request", seconds=result.seconds)
        )
        self.notifier.ready(text)
        log.info("%s (gate %s)", text, result.seconds)
        return self.finish(self.serve(result))

    def serve(self, result: GateResult) -> int:
        assert self.process is not None
        interval = watchdog_interval()
        if interval is None:
            wait_for_exit(self.process, None)
        else:
            self.watch(interval)
        code = self.process.wait()
        if self.stop_signal is None:
            # The front end is gone: the engine processes it left behind serve nobody, and
            # they hold the output pipes open, so the journal's last lines would wait on them.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.tail.drain()
            reason = f"server exited with status {code} while serving"
            log.error("%s; last lines:\n%s", reason, "\n".join(self.tail.lines()))
            write_status(
                self.options.status_file,
                self.status(
                    "failed",
                    phase="serving",
                    reason=reason,
                    log_tail=self.tail.lines(),
                    first_error=self.tail.first_error(),
                    seconds=result.seconds,
                ),
            )
        return code

    def watch(self, interval: float) -> None:
        """Until the server exits: every `interval` the serving checks, and WATCHDOG=1 only
        when they pass."""
        assert self.process is not None
        checks = ServingChecks(self.options.gate, interval, self.options.stall_timeout)
        try:
            while True:
                started = time.monotonic()
                problem = checks.problem()
                if self.process.poll() is None and self.stop_signal is None:
                    if problem is None:
                        self.notifier.watchdog()
                    self.mark_unhealthy(problem, interval)
                left = interval - (time.monotonic() - started)
                if wait_for_exit(self.process, max(0.0, left)):
                    return
        finally:
            checks.close()

    def mark_unhealthy(self, problem: str | None, interval: float) -> None:
        """One journal line and one status write when the pings stop (or start again), and
        when the cause changes from health to a stall or back."""
        kind = problem.split(" ", 1)[0] if problem else None
        if kind == (self.unhealthy.split(" ", 1)[0] if self.unhealthy else None):
            return
        watchdog_s = 2 * interval
        if problem is None:
            log.info("healthy again (was: %s); pinging the watchdog", self.unhealthy)
            self.notifier.status(
                f"serving {self.options.gate.served_model_name} on {self.options.gate.url}"
            )
        else:
            log.error(
                "not pinging the watchdog: %s; systemd restarts the unit after %g s without "
                "a ping (WatchdogSec=)",
                problem,
                watchdog_s,
            )
            self.notifier.status(f"unhealthy: {problem}")
        self.unhealthy = problem
        write_status(
            self.options.status_file,
            self.status("ready", phase="serving", seconds=self.seconds, unhealthy=problem),
        )

    def cannot_start(self, exc: OSError) -> int:
        """The server cannot be run as this unit's user (a vLLM it may not read or run)."""
        reason = (
            f"cannot run {self.argv[0]} as uid {os.getuid()}: {exc.strerror or exc}; "
            "the endpoint runs as the user epyc-llm: make the vLLM environment readable "
            "and executable by it"
        )
        log.error("%s", reason)
        write_status(self.options.status_file, self.status("failed", phase="start", reason=reason))
        self.notifier.status(f"failed to start: {reason}")
        return GATE_FAILED_EXIT

    def gate_failed(self, result: GateResult) -> int:
        assert self.process is not None
        code = stop_server(self.process, self.options.stop_timeout)
        self.tail.drain()
        lines = self.tail.lines()
        log.error(
            "health gate failed in phase %s: %s (server status %s); last lines:\n%s",
            result.phase,
            result.reason,
            code,
            "\n".join(lines),
        )
        if first_error := self.tail.first_error():
            log.error("the server's first error:\n%s", "\n".join(first_error))
        write_status(
            self.options.status_file,
            self.status(
                "failed",
                phase=result.phase,
                reason=result.reason,
                log_tail=lines,
                first_error=self.tail.first_error(),
                seconds=result.seconds,
            ),
        )
        self.notifier.status(f"failed in phase {result.phase}: {result.reason}")
        return GATE_FAILED_EXIT

    def finish(self, code: int) -> int:
        """Leftover children go; a server killed by a signal makes us die by it too."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.tail.drain()
        log.info("server exited with status %d", code)
        if self.stop_signal is not None:
            reason = f"stopped by signal {self.stop_signal}; server exited with status {code}"
            write_status(self.options.status_file, self.status("stopped", reason=reason))
        if code < 0:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            return 128 - code
        return code


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--name", required=True, help="the endpoint's name")
@click.option("--url", required=True, help="base URL of the server, without /v1")
@click.option("--served-model-name", required=True, help="the id /v1/models must list")
@click.option(
    "--endpoint",
    type=click.Choice(["chat_completions", "completions"]),
    default="chat_completions",
    show_default=True,
    help="the primary endpoint the smoke request goes to",
)
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
    help="file holding the server's API key (sent as a Bearer token, given to it as VLLM_API_KEY)",
)
@click.option(
    "--api-key-credential",
    help="name of the unit's credential (LoadCredential=) holding the API key; as --api-key-file",
)
@click.option(
    "--health-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="seconds for /v1/models and for each watchdog /health check",
)
@click.option(
    "--load-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="seconds for /health to answer 200 while loading",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="seconds for the smoke request",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="seconds between SIGTERM and SIGKILL after a failed gate",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_STALL_TIMEOUT_S,
    show_default=True,
    help="seconds with requests running and no prompt or generated token counted in the "
    "server's /metrics after which the engine counts as hung (the watchdog pings stop)",
)
@click.option(
    "--status-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON state for epycctl status",
)
@click.argument("server_argv", nargs=-1, required=True, type=click.UNPROCESSED)
def main(
    name: str,
    url: str,
    served_model_name: str,
    endpoint: PrimaryEndpoint,
    api_key_file: Path | None,
    api_key_credential: str | None,
    health_timeout: float,
    load_timeout: float,
    request_timeout: float,
    stop_timeout: float,
    stall_timeout: float,
    status_file: Path | None,
    server_argv: tuple[str, ...],
) -> None:
    """Start SERVER_ARGV, gate it, and tell systemd when it serves."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"epycd-supervisor[{name}]: %(message)s"
    )
    options = SupervisorOptions(
        name=name,
        gate=GateConfig(
            url=url.rstrip("/"),
            served_model_name=served_model_name,
            endpoint=endpoint,
            api_key=read_api_key(api_key_file, "--api-key-file")
            or read_api_key(credential_path(api_key_credential)),
            health_timeout=health_timeout,
            load_timeout=load_timeout,
            request_timeout=request_timeout,
        ),
        status_file=status_file,
        stop_timeout=stop_timeout,
        stall_timeout=stall_timeout,
    )
    sys.exit(Supervisor(options, server_argv).run())


if __name__ == "__main__":
    main()
