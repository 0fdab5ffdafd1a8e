"""A test-made sd_notify socket: what systemd would receive from a Type=notify service."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from types import TracebackType


class NotifySocket:
    """An AF_UNIX/SOCK_DGRAM socket bound at `path`; each datagram is time-stamped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[tuple[float, str]] = []

    def __enter__(self) -> NotifySocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)

    def receive(self, timeout: float) -> str | None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        message = data.decode()
        self.messages.append((time.monotonic(), message))
        return message

    def wait_for(self, field: str, timeout: float) -> str | None:
        """The first datagram (from now on) holding the line `field`, or None after timeout."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.receive(remaining)
            if message is not None and field in message.split("\n"):
                return message
        return None

    def fields(self) -> list[str]:
        return [line for _, message in self.messages for line in message.split("\n")]
