"""What `epycctl plan` puts on the terminal: a value holding a bidirectional override
(U+202E) or another format character is shown escaped, in the table, the units and the
error line alike (epycd.text.escaped); the unit files themselves keep their own rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosts import make_host
from tests.plan.conftest import PlanWorkspace
from tests.plan.test_cli_plan import run

pytestmark = pytest.mark.usefixtures("podman_5")

RLO = "\u202e"


@pytest.fixture
def podman_5(monkeypatch: pytest.MonkeyPatch) -> None:
    from epycd.host import runtimes
    from epycd.host.facts import RuntimeFacts
    from tests.plan.conftest import PODMAN_5

    monkeypatch.setattr(runtimes, "probe_runtimes", lambda vllm=None: RuntimeFacts(podman=PODMAN_5))


def test_a_served_model_name_with_a_bidi_override_is_shown_escaped(
    ws: PlanWorkspace, tmp_path: Path
) -> None:
    root = make_host(tmp_path / "hosts", "genoa-9654-2s-nps1")
    ws.endpoint("chat", f'served_model_name = "chat{RLO}gpj.exe"\n')
    result = run(ws, "chat", "--root", str(root))
    assert result.exit_code == 0, result.output
    assert RLO not in result.output
    assert "chat\\u202egpj.exe" in result.output
    assert "--served-model-name" in result.output


def test_a_model_path_with_a_format_character_is_shown_escaped(
    ws: PlanWorkspace, tmp_path: Path
) -> None:
    root = make_host(tmp_path / "hosts", "genoa-9654-2s-nps1")
    ws.endpoint("chat", f'model = "/srv/models/qwen{RLO}\u200b3"\n')
    result = run(ws, "chat", "--root", str(root))
    assert result.exit_code != 0
    assert RLO not in result.output and "\u200b" not in result.output
    assert "qwen\\u202e\\u200b3" in result.output
