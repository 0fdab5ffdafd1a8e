"""Status and daemon tests: every EPYCD_* folder in a temporary directory, a fake 2-socket
Genoa host root, a local model folder, endpoint files planned by the real planner for the
host path with the real vLLM CPU venv (tests/tools/vllm_venv.sh; probed once per session and
handed to the product's own probe cache), approvals made by the approval code, and a
`systemctl` on PATH that answers from a small JSON state file, since systemd is not PID 1
here (the real-systemd proof is tests/e2e)."""

from __future__ import annotations

import json
import random
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epycd.approval.record import Approval, approved_plans, current_approver
from epycd.approval.workflow import install_approval, make_approval
from epycd.host.facts import HostVllmFacts
from epycd.host.probe_cache import PROBE_CACHE, ProbeCache
from epycd.paths import endpoint_status_file
from epycd.plan.pipeline.current import Planned, plan_endpoints
from epycd.render import render_for_plan
from epycd.settings import Settings
from epycd.status.collect import collect_status, planned_map
from epycd.status.machine import EndpointStatus
from epycd.supervisor import SupervisorStatus, write_status
from tests.health.realvllm import vllm_executable
from tests.hosts import make_host
from tests.plan.conftest import write_model
from tests.sandbox import CliSandbox

FAKE_SYSTEMCTL = """#!{python}
# Answers like systemctl from $FAKE_SYSTEMD_STATE (unit -> properties) and records its argv
# in $FAKE_SYSTEMCTL_LOG. Used only because systemd is not PID 1 on the test machine.
import json, os, sys

state_file = os.environ["FAKE_SYSTEMD_STATE"]
with open(os.environ["FAKE_SYSTEMCTL_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
try:
    with open(state_file) as f:
        units = json.load(f)
except FileNotFoundError:
    units = {{}}
args = [a for a in sys.argv[1:] if not a.startswith("--")]
verb, names = args[0], args[1:]

def unit(name):
    return units.setdefault(name, {{"LoadState": "loaded", "ActiveState": "inactive",
        "SubState": "dead", "Result": "success", "UnitFileState": "disabled"}})

def save():
    with open(state_file + ".tmp", "w") as f:
        json.dump(units, f)
    os.replace(state_file + ".tmp", state_file)

if verb == "show":
    blocks = []
    for name in names:
        props = units.get(name, {{"LoadState": "not-found", "ActiveState": "inactive",
            "SubState": "dead", "Result": "success", "UnitFileState": ""}})
        blocks.append("\\n".join(["Id=" + name] + [k + "=" + v for k, v in props.items()]))
    print("\\n\\n".join(blocks))
elif verb == "is-active":
    state = units.get(names[0], {{}}).get("ActiveState", "inactive")
    print(state)
    sys.exit(0 if state == "active" else 3)
elif verb == "is-enabled":
    state = units.get(names[0], {{}}).get("UnitFileState", "disabled")
    print(state)
    sys.exit(0 if state == "enabled" else 1)
elif verb in ("start", "restart"):
    for name in names:
        unit(name).update(ActiveState=os.environ.get("FAKE_START_STATE", "active"),
                          SubState="start", Result="success")
    save()
elif verb == "stop":
    for name in names:
        unit(name).update(ActiveState="inactive", SubState="dead")
    save()
elif verb in ("enable", "disable"):
    for name in names:
        unit(name)["UnitFileState"] = verb + "d"
    save()
"""


def real_plan_endpoints(settings: Settings) -> Planned:
    """What every command plans: the real planner, the approvals holding their places."""
    return plan_endpoints(settings, approved_plans(settings), render=render_for_plan)


@dataclass
class DaemonSandbox(CliSandbox):
    """A `CliSandbox` on a fake Genoa host root with a local model, the real vLLM venv, and
    a `systemctl` that keeps unit states in `systemd_state`."""

    model: Path = Path()
    systemd_state: Path = Path()

    def environ(self, *, system_path: bool = True, **extra: str) -> dict[str, str]:
        state = {"FAKE_SYSTEMD_STATE": str(self.systemd_state)}
        return super().environ(system_path=system_path, **state) | extra

    def endpoint(self, name: str, extra: str = "") -> Path:
        """NAME.toml on a port nobody listens on now: the planner moves an endpoint off a
        port another process took, which is drift, and other tests run on this machine."""
        path = self.settings.config_dir / f"{name}.toml"
        port = "" if "port" in extra else f"port = {free_port()}\n"
        vllm = vllm_executable()
        path.write_text(f'model = "{self.model}"\nruntime = "host"\nvllm = "{vllm}"\n{port}{extra}')
        return path

    def approve(self, name: str) -> Approval:
        """What `epycctl approve NAME --no-start` does after the yes: the approval code."""
        results, host = real_plan_endpoints(self.settings)
        result = next(r for r in results if r.endpoint == name)
        assert result.plan is not None, [p.text for p in result.errors]
        approval = make_approval(
            self.settings, result.plan, host, current_approver(), accepted_unvalidated=False
        )
        install_approval(self.settings, approval)
        return approval

    def units(self) -> dict[str, dict[str, str]]:
        if not self.systemd_state.exists():
            return {}
        data: dict[str, dict[str, str]] = json.loads(self.systemd_state.read_text())
        return data

    def set_unit(self, unit: str, active: str, result: str = "success") -> None:
        data = self.units()
        data.setdefault(unit, {"LoadState": "loaded", "UnitFileState": "enabled"})
        data[unit].update(ActiveState=active, SubState=active, Result=result)
        self.systemd_state.write_text(json.dumps(data))

    def supervisor_says(self, name: str, state: str, **fields: Any) -> None:
        write_status(
            endpoint_status_file(self.settings.run_dir, name),
            SupervisorStatus.model_validate(
                {"state": state, "name": name, "url": "http://127.0.0.1:1", "model": name} | fields
            ),
        )

    def statuses(self) -> dict[str, EndpointStatus]:
        results, _host = real_plan_endpoints(self.settings)
        return {s.name: s for s in collect_status(self.settings, planned_map(results))}


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port nobody listens on now, below the kernel's ephemeral range: a real vLLM that
    another test runs meanwhile binds its workers' ports there (port 0), and one of them could
    take a port from that range between this choice and the plan's check of it."""
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    for port in random.sample(range(low // 2, low), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {low // 2}-{low - 1}")


@pytest.fixture(scope="session")
def vllm_facts() -> HostVllmFacts:
    """The real probe of the real vLLM venv, once per session (it takes ~20 s here)."""
    from epycd.host.vllm_probe import probe_vllm

    facts = probe_vllm(str(vllm_executable()))
    assert facts.present and not facts.error, facts
    return facts


@pytest.fixture(scope="session")
def vllm_registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """The real vLLM venv's model registry as the planner keeps it in the probe cache
    ((entry, answer)), asked once per session: importing vLLM takes about 5 s here, and each
    test's run folder starts empty (epycd.engines.vllm.model.support.installed_registry)."""
    from epycd.engines.vllm.model.support import installed_registry

    cache = ProbeCache(tmp_path_factory.mktemp("registry") / PROBE_CACHE)
    installed_registry(vllm_executable(), cache=cache)
    [(entry, answer)] = [(k, v) for k, v in cache.load().items() if k.startswith("registry|")]
    return entry, answer


def make_workspace(
    base: Path,
    monkeypatch: pytest.MonkeyPatch,
    facts: HostVllmFacts,
    registry: tuple[str, dict[str, Any]],
) -> DaemonSandbox:
    (base / "hf").mkdir(parents=True)
    folders = CliSandbox.create(base, HF_HOME=str(base / "hf"))
    ws = DaemonSandbox(
        tmp=base,
        vars=folders.vars,
        bin_dir=folders.bin_dir,
        model=write_model(base / "models" / "qwen3"),
        systemd_state=base / "systemd-state.json",
    )
    ws.vars["EPYCD_HOST_ROOT"] = str(make_host(base / "hosts", "genoa-9654-2s-nps1"))
    ws.install_fake_systemctl(FAKE_SYSTEMCTL.format(python=sys.executable))
    settings = ws.settings
    key = ProbeCache.key(str(vllm_executable()))
    assert key is not None
    cache = settings.run_dir / PROBE_CACHE
    entry, answer = registry
    cache.write_text(json.dumps({key: facts.model_dump(mode="json"), entry: answer}))
    for name, value in ws.environ().items():
        if name.startswith(("EPYCD_", "FAKE_")) or name in {"PATH", "HF_HOME"}:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("EPYCD_ADMIN_GROUP", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    return ws


@pytest.fixture
def ws(
    monkeypatch: pytest.MonkeyPatch,
    vllm_facts: HostVllmFacts,
    vllm_registry: tuple[str, dict[str, Any]],
) -> Iterator[DaemonSandbox]:
    """Folders another user can reach too (pytest's tmp folder is root-only), under a short
    path so that a notify socket fits in sun_path."""
    base = Path(tempfile.mkdtemp(prefix="epycd-d-"))
    base.chmod(0o755)
    try:
        yield make_workspace(base, monkeypatch, vllm_facts, vllm_registry)
    finally:
        shutil.rmtree(base, ignore_errors=True)
