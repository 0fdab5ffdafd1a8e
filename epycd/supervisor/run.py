"""The supervisor's run (the package docstring says what it does): start, gate, READY=1,
the watchdog while serving, signals, and why it stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import httpx
from pydantic import BaseModel

from epycd.health import (
    API_KEY_ENV,
    GateConfig,
    GateResult,
    StallWatch,
    auth_headers,
    health_problem,
    read_progress,
    run_gate,
)
from epycd.notify import Notifier, watchdog_interval
from epycd.supervisor import SupervisorState, SupervisorStatus, read_status, write_status
from epycd.supervisor.process import (
    LogTail,
    pings_while,
    start_server,
    stop_server,
    wait_for_exit,
)

GATE_FAILED_EXIT = 1
UNASKED_EXIT = 1
"""The supervisor's status when the server exited with 0 while serving and nobody asked it
to stop: vLLM's API server shuts down cleanly when its EngineCore dies (an OOM kill, a
crash), and a clean exit would be a success that `Restart=on-failure` never acts on."""
DEFAULT_STALL_TIMEOUT_S = 120.0
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
WATCHDOG_SIGNAL = signal.SIGABRT
"""systemd's default WatchdogSignal=: the supervisor records why and kills the server."""

log = logging.getLogger("epycd.supervisor")


class SupervisorOptions(BaseModel):
    name: str
    gate: GateConfig
    status_file: Path | None = None
    stop_timeout: float = 30.0
    stall_timeout: float = DEFAULT_STALL_TIMEOUT_S
    api_key_env: str = API_KEY_ENV


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
        before = read_status(options.status_file) if options.status_file else None
        self.ready_runs = before.ready_runs if before is not None else 0
        self.ready_seconds = before.ready_seconds if before is not None else 0.0

    def status(self, state: SupervisorState, **fields: object) -> SupervisorStatus:
        return SupervisorStatus.model_validate(
            {
                "state": state,
                "name": self.options.name,
                "url": self.options.gate.url,
                "model": self.options.gate.served_model_name,
                "pid": self.process.pid if self.process else None,
                "invocation": os.environ.get("INVOCATION_ID"),
                "ready_runs": self.ready_runs,
                "ready_seconds": self.ready_seconds,
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
            self.process = start_server(
                self.argv, self.tail, gate.api_key, self.options.api_key_env
            )
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
        self.ready_runs += 1
        self.ready_seconds = round(self.ready_seconds + sum(result.seconds.values()), 3)
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
        """Leftover children go; a server killed by a signal makes us die by it too, and one
        that exited by itself, even with 0, makes the run a failure."""
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
        if code == 0 and self.stop_signal is None:
            log.error("nobody asked the server to stop: exiting %d (a failed run)", UNASKED_EXIT)
            return UNASKED_EXIT
        return code
