"""The admin's side of the llama.cpp end-to-end test (tests/e2e/test_llama.py), run inside
the booted bare machine by the same oneshot driver unit as tests/e2e/inside.py, whose helpers
it reuses (copied beside it into /opt/e2e). The machine is the bare Debian of README command
1 (no venv module, no compiler, no network), with llama-server already built in
/opt/epyc-llm/llama-runtime (the recipe's finished folder, built on this CPU by
tests/tools/llama_server.sh) and a GGUF file in /srv/models. One phase per boot:

install  README command 1 with the engine chosen: `install.sh --engine llama.cpp` (the venv
         module and g++ from apt, the recipe finds its build done), then `epycctl quickstart
         --engine llama.cpp --model FILE --yes` -> ready, the hand-off, a chat, status; the
         server's own process: its CPUs, threads and argv
reboot   back with no new approval: status ready, a chat
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import inside
from inside import (
    CONFIG,
    PhaseFailed,
    endpoint_entry,
    epycctl_status,
    journal,
    must,
    record,
    run,
    show,
    use_identity_root,
    wait_for_daemon,
    wait_until,
)

PREFIX = Path("/opt/epyc-llm")
NAME = "default"
UNIT = f"epyc-llm-{NAME}.service"
UNIT_FILE = Path("/etc/systemd/system") / UNIT
ENDPOINT_FILE = Path("/etc/epyc-llm") / f"{NAME}.toml"
inside.UNIT = UNIT
inside.ENV |= {"PIP_INDEX_URL": f"file://{CONFIG['pypi']}", "PIP_CACHE_DIR": "/root/.cache/pip"}

CHAT = """
import json, sys
import httpx
url, = sys.argv[1:]
model = httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]
reply = httpx.post(url + "/chat/completions", timeout=60, json={
    "model": model, "messages": [{"role": "user", "content": "Say hello"}],
    "temperature": 0, "max_tokens": 8}).json()
print(json.dumps({"choices": len(reply["choices"]), "model": reply["model"],
                  "completion_tokens": reply["usage"]["completion_tokens"]}))
"""


def status_url(check: str) -> str | None:
    """`epycctl status` recorded as `check`, and the endpoint's URL (with /v1) in it."""
    url = endpoint_entry(epycctl_status(check, NAME), NAME).get("url")
    return None if url is None else str(url)


def chat(check: str, url: str | None) -> None:
    if url is None:
        record(check, rc=None, reply=None, stderr="no URL in status")
        return
    done = run(str(PREFIX / "bin" / "python"), "-c", CHAT, url, timeout=120)
    reply = json.loads(done["stdout"].strip().splitlines()[-1]) if done["rc"] == 0 else None
    record(check, rc=done["rc"], reply=reply, url=url, stderr=done["stderr"][-3000:])


def server_process(check: str) -> None:
    """llama-server as the kernel sees it: its CPUs, threads, user and argv."""
    found = run("pgrep", "-x", "llama-server")["stdout"].split()
    if not found:
        record(check, pid=None)
        return
    pid = found[0]
    proc = Path("/proc") / pid
    fields = dict(
        line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line
    )
    record(
        check,
        pid=int(pid),
        argv=(proc / "cmdline").read_text().split("\0")[:-1],
        cpus=fields["Cpus_allowed_list"].strip(),
        mems=fields["Mems_allowed_list"].strip(),
        threads=int(fields["Threads"]),
        uid=fields["Uid"].split()[0],
        locked_kib=int(fields["VmLck"].split()[0]),
        memlock_limit=next(
            (line for line in (proc / "limits").read_text().splitlines() if "locked" in line), ""
        ),
        numa_policy=run("sh", "-c", f"head -1 /proc/{pid}/numa_maps")["stdout"].strip(),
    )


def fresh_machine() -> None:
    tools = ("g++", "c++", "podman", "docker", "vllm", "epycctl", "pip", "pip3")
    found = {tool: run("sh", "-c", f"command -v {tool}")["stdout"].strip() for tool in tools}
    record(
        "fresh",
        found=found,
        ensurepip=run("python3", "-c", "import ensurepip")["rc"] == 0,
        pypi_resolves=run("getent", "hosts", "pypi.org")["rc"] == 0,
    )


def phase_install() -> None:
    record("pid1", comm=Path("/proc/1/comm").read_text().strip())
    fresh_machine()
    started = time.monotonic()
    must("install", "/src/packaging/install.sh", "--engine", "llama.cpp", timeout=1500)
    installed = time.monotonic()
    must("model_group", "chgrp", "-R", "epyc-llm", CONFIG["model_dir"], timeout=60)
    must("model_mode", "chmod", "-R", "u+rwX,g+rX,g-w,o-rwx", CONFIG["model_dir"], timeout=60)
    use_identity_root()
    argv = ("epycctl", "quickstart", "--engine", "llama.cpp", "--model", CONFIG["gguf"], "--yes")
    done = run(*argv, timeout=900, check="quickstart")
    record(
        "timing",
        install_s=round(installed - started, 1),
        quickstart_s=done["seconds"],
        fresh_to_ready_s=round(time.monotonic() - started, 1),
    )
    if done["rc"] != 0:
        journal("journal_serving", UNIT)
        raise PhaseFailed(f"quickstart failed (exit {done['rc']}): {done['stderr'][-2000:]}")
    record("unit", **show(UNIT))
    record("unit_file", text=UNIT_FILE.read_text())
    record("endpoint_file", text=ENDPOINT_FILE.read_text())
    chat("chat", status_url("status"))
    server_process("server")
    journal("journal_serving", UNIT)


def phase_reboot() -> None:
    wait_for_daemon("boot_timeline")
    wait_until(
        "the endpoint unit settles",
        lambda: show(UNIT, "ActiveState")["ActiveState"] in {"active", "failed"},
        600,
    )
    record("unit", **show(UNIT))
    chat("chat", status_url("status"))
    server_process("server")


PHASES = {"install": phase_install, "reboot": phase_reboot}

if __name__ == "__main__":
    inside.PHASES = PHASES
    inside.main()
