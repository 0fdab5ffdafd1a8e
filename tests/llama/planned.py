"""`epycctl plan --json` of one llama.cpp endpoint served by this machine's llama-server,
planned against this machine's own topology (tests/machine.py `serving`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.health.realvllm import free_port
from tests.llama.realllama import llama_server
from tests.machine import serving
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_cli_plan import run


def planned_with_real_llama(
    tmp_path: Path, name: str, model: Path, keys: str = ""
) -> dict[str, Any]:
    """The plan of endpoint `name` (`model` on a free port, `keys` more lines of its file);
    it must plan (exit 0)."""
    (tmp_path / "ws").mkdir()
    ws = PlanWorkspace(tmp_path / "ws")
    ws.endpoint(name, f'engine = "llama.cpp"\nllama_server = "{llama_server()}"\n'
                f'model = "{model}"\nport = {free_port()}\n{keys}')  # fmt: skip
    done = run(ws, name, "--json", "--root", str(serving(tmp_path).root))
    assert done.exit_code == 0, done.output
    data: dict[str, Any] = json.loads(done.output)
    return data
