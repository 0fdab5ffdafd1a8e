"""`epycctl estimate --json` as it answers today: the whole JSON object and the exit code of
each call below, in tests/golden/estimate.json, so that moving the sizing into one step
(engines/vllm/plan/sizing.py) is checked against it. Two models from the offline hub cache
(tests/model/models.py): Qwen3-0.6B, whose weights are estimated from config.json, and
Llama-3.1-8B-Instruct, whose weights are its safetensors index's total; each on a socket
given in GiB and on socket 0 of a catalogue host (tests/hosts.py), where the first NUMA
node's rule can cut the KV pool.
`UPDATE_GOLDEN=1` writes the file anew: review the diff before committing it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from epycd.cli import main
from tests.hosts import make_host

pytestmark = pytest.mark.usefixtures("offline_hub")

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "estimate.json"
QWEN = "Qwen/Qwen3-0.6B"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CALLS: dict[str, tuple[str | None, list[str]]] = {
    "qwen-defaults-given-32gib": (None, [QWEN, "--socket-gb", "32"]),
    "qwen-defaults-genoa-nps1": ("genoa-9654-2s-nps1", [QWEN]),
    "qwen-8k-x256-milan": ("milan-7763-2s", [QWEN, "--max-model-len", "8192",
                                             "--max-num-seqs", "256"]),
    "llama-128k-x4-given-64gib": (None, [LLAMA, "--max-model-len", "131072",
                                         "--max-num-seqs", "4", "--socket-gb", "64"]),
    "llama-128k-x16-genoa-nps4": ("genoa-9654-2s-nps4", [LLAMA, "--max-model-len", "131072",
                                                         "--max-num-seqs", "16"]),
    "llama-defaults-genoa-nps4": ("genoa-9654-2s-nps4", [LLAMA]),
}  # fmt: skip
"""Each call: the catalogue host whose socket 0 is measured (None: --socket-gb), and the
arguments after `epycctl estimate`."""


def test_estimate_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {}
    for label, (host, args) in CALLS.items():
        assert (host is None) == ("--socket-gb" in args), label  # never this machine's socket
        if host is not None:
            monkeypatch.setenv("EPYCD_HOST_ROOT", str(make_host(tmp_path, host)))
        else:
            monkeypatch.delenv("EPYCD_HOST_ROOT", raising=False)
        result = CliRunner().invoke(main, ["estimate", *args, "--json"])
        answers[label] = {
            "host": host,
            "args": args,
            "exit_code": result.exit_code,
            "json": json.loads(result.stdout),
        }
    text = json.dumps(answers, indent=2) + "\n"
    assert str(tmp_path) not in text
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.is_file(), f"{GOLDEN} is missing: run with UPDATE_GOLDEN=1 and review it"
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert list(answers) == list(expected)
    for label, answer in answers.items():
        assert answer == expected[label], label
    assert text == GOLDEN.read_text(encoding="utf-8")
