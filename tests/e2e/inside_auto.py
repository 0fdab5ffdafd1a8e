"""The admin's side of the `engine = "auto"` end-to-end test (tests/e2e/test_auto.py), run
inside the booted bare machine by the oneshot driver unit of tests/e2e/inside.py, whose helpers
it reuses, with inside_llama.py's (both copied beside it into /opt/e2e). The machine is the
bare Debian of README command 1 (no venv module, no compiler, no network), with llama-server
already built in /opt/epyc-llm/llama-runtime (the recipe's finished folder: its binaries, stamp
and kept source, but no converter) and a safetensors model with a SentencePiece tokenizer in
/srv/models. One phase per boot:

install  `install.sh --runtime --engine llama.cpp` (both runtimes; the llama.cpp recipe keeps
         its build and installs the converter from the kept source), then `epycctl quickstart
         --model DIR --yes` with no engine: the plan chooses llama.cpp (profile balanced), the
         model is converted first (the converter under the vLLM runtime's Python), then
         approved, ready, a chat; the server's own process and the conversion's record
reboot   back with no new approval: status ready, a chat, the same converted file served
"""

from __future__ import annotations

import json
from pathlib import Path

import inside
from inside import (
    CONFIG,
    record,
    show,
    wait_for_daemon,
    wait_until,
)
from inside_llama import (
    UNIT,
    chat,
    install_then_quickstart,
    server_process,
    status_url,
)

CONVERTED = Path("/var/cache/epyc-llm-converted")
# the vLLM runtime from the local mirrors, as tests/e2e/inside_runtime.py installs it
inside.ENV |= {
    "PIP_INDEX_URL": f"file://{CONFIG['pypi']}",
    "PIP_EXTRA_INDEX_URL": f"file://{CONFIG['torch_index']}",
}


def converted_files(check: str) -> None:
    """The converted folder: each file, its size and mode, and the records' text."""
    files = sorted(CONVERTED.rglob("*")) if CONVERTED.is_dir() else []
    record(
        check,
        files={
            str(f): {"bytes": f.stat().st_size, "mode": oct(f.stat().st_mode & 0o777)}
            for f in files
            if f.is_file()
        },
        records={str(f): json.loads(f.read_text()) for f in files if f.name.endswith(".json")},
    )


def phase_install() -> None:
    install_then_quickstart(
        ("/src/packaging/install.sh", "--runtime", "--engine", "llama.cpp"),
        1800,
        ("epycctl", "quickstart", "--model", CONFIG["model_dir"], "--yes"),
        lambda: converted_files("converted"),
    )


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
    converted_files("converted")


PHASES = {"install": phase_install, "reboot": phase_reboot}

if __name__ == "__main__":
    inside.PHASES = PHASES
    inside.main()
