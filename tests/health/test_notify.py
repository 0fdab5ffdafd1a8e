"""sd_notify through sdnotify, read back from a socket the test binds."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from epycd.notify import Notifier, watchdog_interval
from tests.health.notifysock import NotifySocket


def test_messages_reach_the_notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with NotifySocket(tmp_path / "notify") as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock.path))
        notifier = Notifier()
        assert notifier.enabled
        notifier.ready("serving tiny on http://127.0.0.1:8000")
        notifier.watchdog()
        notifier.stopping()
        notifier.mainpid(4242)
        received = [sock.receive(2) for _ in range(4)]
    assert received == [
        "READY=1\nSTATUS=serving tiny on http://127.0.0.1:8000",
        "WATCHDOG=1",
        "STOPPING=1",
        "MAINPID=4242",
    ]


def test_abstract_socket_address(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"epyc-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        Notifier().status("loading")
        assert sock.recv(100) == b"STATUS=loading"


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    notifier.ready("x")
    notifier.watchdog()


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("0", None, None),
        ("junk", None, None),
        ("30000000", None, 15.0),
        ("1000000", "self", 0.5),
        ("1000000", "1", None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, str(os.getpid()) if value == "self" else value)
    assert watchdog_interval() == expected
