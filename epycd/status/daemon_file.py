"""epycd's `RUN_DIR/status.json`, as `epycctl status NAME` reads it for the live load.

The daemon rewrites the file only when its content changes, so its age says nothing; what
says it is current is that the daemon that wrote it still runs: its `daemon.pid` is a live
process, and that process is epycd (after a crash the pid may be anyone's). Anything else
(no file, a file that does not parse, another process, a dead one) reads as no load.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from epycd.paths import DAEMON_STATUS_FILE
from epycd.readfile import PROC_MAX_BYTES, STATE_MAX_BYTES, read_bytes, read_text
from epycd.settings import Settings
from epycd.status.instances import InstanceLoad

PROC = Path("/proc")
DAEMON_NAME = "epycd"


def is_epycd(pid: int, proc: Path = PROC) -> bool:
    """Whether process `pid` runs and is epycd: its command name (`comm`, the script's name
    when run as /opt/epyc-llm/bin/epycd) or its program (the first two words of its command
    line: the interpreter and the script) is named epycd."""
    if pid <= 0:
        return False
    folder = proc / str(pid)
    try:
        comm = read_text(folder / "comm", PROC_MAX_BYTES).strip()
        argv = read_bytes(folder / "cmdline", PROC_MAX_BYTES).split(b"\0")
    except (OSError, UnicodeDecodeError):
        return False
    programs = [Path(arg.decode(errors="replace")).name for arg in argv[:2] if arg]
    return comm == DAEMON_NAME or DAEMON_NAME in programs


def daemon_loads(settings: Settings, proc: Path = PROC) -> dict[str, list[InstanceLoad]]:
    """Endpoint -> its instances' load, as the running epycd last wrote it; {} when no epycd
    runs, it has written nothing yet or the file cannot be read."""
    try:
        data = json.loads(read_bytes(settings.run_dir / DAEMON_STATUS_FILE, STATE_MAX_BYTES))
        pid = data["daemon"]["pid"]
        endpoints = data["endpoints"]
        if not isinstance(pid, int) or not isinstance(endpoints, list):
            return {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not is_epycd(pid, proc):
        return {}
    found = {}
    for endpoint in endpoints:
        try:
            name = endpoint["name"]
            loads = [InstanceLoad.model_validate(item) for item in endpoint.get("load") or []]
        except (KeyError, TypeError, AttributeError, ValidationError):
            continue
        if isinstance(name, str) and loads:
            found[name] = loads
    return found
