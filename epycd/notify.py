"""sd_notify for the supervisor and the daemon, through the `sdnotify` package.

Without `NOTIFY_SOCKET` (not started by systemd as `Type=notify`) every call does nothing.
"""

from __future__ import annotations

import os

import sdnotify

from epycd.text import is_digits


class Notifier:
    """Sends state lines to the service manager named by `NOTIFY_SOCKET`."""

    def __init__(self) -> None:
        self._notifier = sdnotify.SystemdNotifier() if os.environ.get("NOTIFY_SOCKET") else None

    @property
    def enabled(self) -> bool:
        return self._notifier is not None

    def send(self, *fields: str) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(fields))

    def ready(self, status: str | None = None) -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> None:
        self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def mainpid(self, pid: int) -> None:
        self.send(f"MAINPID={pid}")


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of `WATCHDOG_USEC`), or None when not asked.

    systemd sets `WATCHDOG_PID` to the process it expects the pings from; another process
    (a child that inherited the environment) must not ping.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not is_digits(usec) or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2 / 1_000_000
