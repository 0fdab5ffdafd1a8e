"""The systemctl/journalctl wrapper against the machine's real tools (systemd is not PID 1
here, so they answer with their real refusals) and against PATH tricks for what cannot
happen for real (a hung systemctl)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from epycd import systemd
from epycd.systemd import SystemdError


def require_real(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed: run tests/bootstrap.sh (apt-get install systemd)")


def systemd_is_pid1() -> bool:
    """sd_booted(3)'s own test: systemd runs as the init system when this folder exists."""
    return Path("/run/systemd/system").is_dir()


def test_real_systemctl_daemon_reload() -> None:
    """Without systemd as PID 1 (these test machines, most containers): a clear error with
    systemd's own words; with it: daemon-reload works (a harmless reload of the manager)."""
    require_real("systemctl")
    if systemd_is_pid1():
        systemd.daemon_reload()
        return
    with pytest.raises(SystemdError) as caught:
        systemd.daemon_reload()
    text = str(caught.value)
    assert text.startswith("`systemctl daemon-reload` failed (exit 1): ")
    assert "System has not been booted with systemd" in text
    assert caught.value.exit_code == 1


def test_real_is_active_of_an_unknown_unit() -> None:
    require_real("systemctl")
    if systemd_is_pid1():
        assert systemd.is_active("epyc-llm-nosuch.service") == "inactive"
        return
    with pytest.raises(SystemdError, match="answered nothing: System has not been booted"):
        systemd.is_active("epyc-llm-nosuch.service")


def test_real_is_enabled_of_an_unknown_unit() -> None:
    require_real("systemctl")
    assert systemd.is_enabled("epyc-llm-nosuch-unit.service") == "not-found"


def test_real_journal_of_a_unit_without_entries() -> None:
    require_real("journalctl")
    assert "No entries" in systemd.journal(["epyc-llm-nosuch.service"], lines=5)


def test_missing_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemdError, match="`systemctl` not found on PATH"):
        systemd.enable(["x.service"])


def test_hung_systemctl_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(
        SystemdError, match=r"`systemctl start a.service` did not finish within 0.5 s"
    ):
        systemd.start(["a.service"], timeout=0.5)
