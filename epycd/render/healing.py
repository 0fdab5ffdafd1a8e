"""The lines that make a unit heal (docs/healing.md), from `decisions.healing`
(epycd.plan.healing); decisions without it (approval records made before the healing
policy, b30f55f) get the units of their time.

- `[Service]` `Restart=on-failure` and `RestartSec=`, or `Restart=no`; where no supervisor
  makes a clean exit a failure (podman, the balancer) also `RestartForceExitStatus=0`: a
  main process that exits 0 by itself did not stop as asked (a stop systemd was asked for is
  never restarted), as vLLM in a container exits 0 when its EngineCore dies; the crash
  recorder counts such a run as failed, so the crash-loop rules hold for it. `WatchdogSec=` where
  the main process is epycd's supervisor (host, docker), also with `Restart=no`: a hung
  engine is then killed and stays down, which is what "no" asks for (a hung engine that
  holds its socket's memory and port is not "up"). With it `LimitCORE=0`: the watchdog's
  SIGABRT reaches every process of the unit, and a vLLM process's core would be the size of
  its weights and KV pool, written where `core_pattern` says (Debian's default: its working
  directory under /var/lib), on every hang.
- `[Unit]` `StartLimitIntervalSec=` and `StartLimitBurst=`: systemd's own limit is only the
  backstop, `BACKSTOP_RUNS` runs above the crash loop epycd's recorder declares first (and
  keeps across a reboot, which systemd's does not). `Restart=no` keeps systemd's default:
  nothing restarts by itself there, and a person's own restarts are not a loop.
- `ExecStopPost=-+PYTHON -m epycd.approval.crashloop NAME --unit UNIT`: privileged (`+`,
  like the approval check: it writes root's state) and forgiven (`-`): a recorder that
  cannot write must never turn a clean stop into a failure that `Restart=` acts on.
"""

from __future__ import annotations

from epycd.plan.healing import Healing
from epycd.plan.model import EndpointService
from epycd.plan.service.unit_commands import crash_recorder_argv
from epycd.render.syntax import command_line
from epycd.render.text import Line

BACKSTOP_RUNS = 2
"""systemd's StartLimitBurst= is the crash loop's run count plus this."""
LEGACY_RESTART_SEC = "30s"
"""RestartSec= of a record from before the healing policy with restart = "on-failure"."""


def restart_lines(decisions: EndpointService) -> list[Line]:
    """[Service] Restart=, RestartSec= and, for a supervised unit, WatchdogSec=."""
    healing = decisions.healing
    if healing is None:
        if decisions.restart == "on-failure":
            return [("Restart", "on-failure"), ("RestartSec", LEGACY_RESTART_SEC)]
        return [("Restart", "no")]
    return service_restart_lines(healing)


def service_restart_lines(healing: Healing) -> list[Line]:
    lines: list[Line] = [("Restart", healing.restart)]
    if healing.restart != "no":
        lines.append(("RestartSec", f"{healing.restart_sec}s"))
        if healing.restart_clean_exit:
            lines.append(("RestartForceExitStatus", "0"))
    if healing.watchdog_s is not None:
        lines += [("WatchdogSec", f"{healing.watchdog_s}s"), ("LimitCORE", "0")]
    return lines


def start_limit_lines(healing: Healing | None) -> list[Line]:
    """[Unit] StartLimitIntervalSec= and StartLimitBurst=: systemd's backstop."""
    if healing is None or healing.restart == "no":
        return []
    return [
        ("StartLimitIntervalSec", f"{healing.start_limit_interval_s}s"),
        ("StartLimitBurst", str(healing.start_limit_burst + BACKSTOP_RUNS)),
    ]


def crash_recorder_lines(decisions: EndpointService) -> list[Line]:
    """[Service] ExecStopPost= of the crash recorder, for the unit `decisions.unit_name`."""
    if decisions.healing is None:
        return []
    argv = crash_recorder_argv(decisions.product_python, decisions.endpoint, decisions.unit_name)
    return [("ExecStopPost", command_line(argv, "crash_recorder", prefix="-+"))]


def health_on_failure_lines(decisions: EndpointService) -> list[Line]:
    """[Container] of podman >= 5 (Notify=healthy): a container whose health check fails is
    killed, podman exits and `Restart=` brings it back (podman-systemd.unit(5)). podman < 5
    runs no health check after the start: there the unit restarts when the container exits."""
    if decisions.healing is None or not decisions.podman_notify_healthy:
        return []
    return [("HealthOnFailure", "kill")]
