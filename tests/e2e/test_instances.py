"""End to end, one endpoint of two instances (docs/instances.md): real systemd (PID 1 under
systemd-nspawn), the real CPU vLLM on the stock route on every machine (a Milan's: no
AVX-512 BF16, vLLM's own CpuPlatform with zentorch hidden, consent; tests/machine.py
`e2e_route`); one instance per core of the 2-core test machine, each pinned to its core
(so each one's front end shares that core: the plan warns); Debian's HAProxy
2.6 in front (the .debs from tests/tools/haproxy.sh, installed with dpkg in a fresh copy of the
cached rootfs; the cache itself is never changed).

Two boots (tests/e2e/inside_instances.py): install + approve + spread + one instance killed,
then a reboot. Ports 18511 (the balancer) and the next free ones for the instances.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epycd.host.cpulist import parse_cpulist
from tests.e2e.conftest import (
    DRIVER_UNIT,
    MODEL_DIR,
    PIP_CACHE,
    ROOTFS,
    Boot,
    Machine,
    clean_copy,
    endpoint,
    endpoint_toml,
    interpreter_home,
    port_free,
    require_tools,
)
from tests.e2e.faultfigures import engine_fault, healing_problem, loaded_kill
from tests.health.realvllm import CACHE, STOCK_VLLM, VENV, stock_vllm_executable
from tests.machine import E2eRoute, e2e_route, write_identity_root

NAME = "pair"
PORT = 18511
PHASES = ("install", "reboot")
LOAD_CONCURRENCY = 8
CHECK_INTERVAL_S = 2.0
"""HAProxy checks each instance every 2 s (epycd.render.balancer.CHECK_INTERVAL)."""
HAPROXY_DEBS = CACHE / "haproxy" / "debs"
IDENTITY_ROOT = "/epyc-identity"

pytestmark = pytest.mark.e2e


@dataclass
class InstancesMachine(Machine):
    def boot(self, phase: str) -> Boot:
        for earlier in PHASES[: PHASES.index(phase) + 1]:
            if earlier not in self.boots:
                if self.failed:
                    pytest.fail(f"an earlier boot ({self.failed}) did not finish")
                self.boots[earlier] = self._boot(earlier)
        return self.boots[phase]


def _config(vllm: Path, route: E2eRoute, identity: str | None) -> dict[str, Any]:
    toml = endpoint_toml(Path(MODEL_DIR), vllm, NAME, PORT).replace(
        "socket = 0\n", "instances = 2\n"
    )
    return {
        "name": NAME,
        "never": "never",
        "port": PORT,
        "served": NAME,
        "client_python": str(VENV / "bin" / "python"),
        "identity_root": identity,
        "consent_args": route.serving.consent_args,
        "model_dir": MODEL_DIR,
        "endpoint_toml": toml,
    }


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstancesMachine]:
    vllm, model = require_tools()
    if not sorted(HAPROXY_DEBS.glob("haproxy_*.deb")):
        pytest.fail(f"no HAProxy .debs in {HAPROXY_DEBS}: run tests/bootstrap.sh")
    for port in range(PORT, PORT + 3):
        if not port_free(port):
            pytest.fail(f"port {port} is in use on this machine; the container shares its network")
    work = tmp_path_factory.mktemp("e2e-instances")
    root, src, results = work / "rootfs", work / "src", work / "results"
    subprocess.run(["cp", "-a", "--reflink=auto", str(ROOTFS), str(root)], check=True)
    clean_copy(src)
    results.mkdir()
    shutil.copy2("/etc/resolv.conf", root / "etc" / "resolv.conf")
    shutil.copytree(model, root / MODEL_DIR.lstrip("/"))
    (root / "opt" / "e2e").mkdir(parents=True)
    here = Path(__file__).parent
    shutil.copy2(here / "inside.py", root / "opt" / "e2e" / "inside.py")
    shutil.copy2(here / "inside_instances.py", root / "opt" / "e2e" / "inside_instances.py")
    shutil.copy2(here / "load.py", root / "opt" / "e2e" / "load.py")
    units = root / "etc" / "systemd" / "system"
    driver = DRIVER_UNIT.replace("/opt/e2e/inside.py", "/opt/e2e/inside_instances.py")
    (units / "e2e-driver.service").write_text(driver)
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (units / "multi-user.target.wants" / "e2e-driver.service").symlink_to(
        "/etc/systemd/system/e2e-driver.service"
    )
    route = e2e_route("stock", work)
    identity = None
    if route.identity is not None:
        identity = IDENTITY_ROOT
        write_identity_root(root / IDENTITY_ROOT.lstrip("/"), route.identity)
    vllm = stock_vllm_executable() if route.hide_zentorch else vllm
    (results / "config.json").write_text(json.dumps(_config(vllm, route, identity), indent=2))
    binds = [
        f"--bind-ro={src}:/src",
        f"--bind={results}:/results",
        f"--bind={PIP_CACHE}:/var/cache/e2e-pip",
        f"--bind-ro={HAPROXY_DEBS}:/haproxy-debs",
        "--bind-ro=/etc/ssl/certs",
        f"--bind-ro={VENV}",
        *([f"--bind-ro={STOCK_VLLM}"] if route.hide_zentorch else []),
    ]
    home = interpreter_home(VENV)
    if home is not None:
        binds.append(f"--bind-ro={home}")
    PIP_CACHE.mkdir(parents=True, exist_ok=True)
    yield InstancesMachine(root, results, binds)
    if os.environ.get("EPYC_E2E_KEEP"):
        print(f"e2e: kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def _states(boot: Boot, check: str) -> dict[str, str]:
    return {unit: props.get("ActiveState", "") for unit, props in boot.one(check)["units"].items()}


BALANCER = f"epyc-llm-{NAME}.service"
FIRST, SECOND = (f"epyc-llm-{NAME}_{i}.service" for i in (1, 2))


def test_both_instances_and_the_balancer_come_up(machine: InstancesMachine) -> None:
    boot = machine.boot("install")
    assert boot.one("approve")["rc"] == 0, boot.one("approve")["stderr"][-3000:]
    assert _states(boot, "units") == {BALANCER: "active", FIRST: "active", SECOND: "active"}
    assert boot.one("route")["backend"] == "stock", "the stock route, on every machine"
    pair = endpoint(boot.one("status")["status"], NAME)
    assert pair["state"] == "ready", pair
    assert [i["state"] for i in pair["instances"]] == ["ready", "ready"]
    cpus = [set(parse_cpulist(i["cpus"])) for i in pair["instances"]]
    assert not cpus[0] & cpus[1] and all(cpus)
    boot.assert_clean()


def test_requests_spread_over_both_instances(machine: InstancesMachine) -> None:
    boot = machine.boot("install")
    assert all(r["rc"] == 0 for r in boot.one("chats")["replies"]), boot.one("chats")
    before, after = boot.one("metrics_before")["served"], boot.one("metrics_after")["served"]
    assert all(isinstance(n, float) for n in [*before, *after]), (before, after)
    served = [b - a for a, b in zip(before, after, strict=True)]
    assert sum(served) == 8 and min(served) >= 1, served


def test_a_killed_instance_comes_back_by_itself_under_load(machine: InstancesMachine) -> None:
    """Instance 2 SIGKILLed under steady load (8 clients): status says degraded (1 of 2), the
    instance restarts with no action by anyone, the set is ready again; the only failed requests
    are ones in flight at the kill (the balancer retries a refused connection on the other
    instance), and the set serves all along."""
    boot = machine.boot("install")
    record = boot.one("kill_under_load")
    figures = loaded_kill(record)
    assert figures.to_degraded_s is not None, "status never showed the set degraded"
    degraded = next(s for s in record["samples"] if s["t"] > record["killed_at"]
                    and s["state"] == "degraded")  # fmt: skip
    assert "1 of 2 instances ready" in degraded["reason"], degraded
    assert figures.to_ready_s is not None, (
        f"the killed instance did not come back by itself: {record['after']}"
    )
    assert record["after"].get("state") == "ready", record["after"]
    assert record["after"]["pid"] != record["pid_before"], "the same server, never restarted"
    assert int(figures.restarts) >= 1, "systemd restarted nothing (NRestarts)"
    late = [t for t in figures.failed_after_kill if t > CHECK_INTERVAL_S]
    assert not late, f"requests sent after the balancer's check interval failed at {late} s"
    assert figures.failed_in_flight <= LOAD_CONCURRENCY, figures
    assert figures.degraded.tokens > 0, "nothing was served while the set was degraded"
    assert figures.after.tokens > 0, figures
    every_unit_active = {BALANCER: "active", FIRST: "active", SECOND: "active"}
    assert _states(boot, "units_after_kill") == every_unit_active
    pair = endpoint(boot.one("status_after_kill")["status"], NAME)
    assert pair["state"] == "ready", pair


def test_a_hung_instance_comes_back_by_itself(machine: InstancesMachine) -> None:
    """Every vLLM process of instance 1 stopped (SIGSTOP): systemd's watchdog kills that
    instance alone and it is back, the set ready again, with no action."""
    boot = machine.boot("reboot")
    fault = boot.one("stop_instance")
    assert fault["victims"], fault
    assert healing_problem(engine_fault(fault), hung=True) is None, fault
    assert endpoint(boot.one("status_after_stop")["status"], NAME)["state"] == "ready"
    assert all(r["rc"] == 0 for r in boot.one("chats_after_stop")["replies"])


def test_reboot_brings_the_set_back(machine: InstancesMachine) -> None:
    boot = machine.boot("reboot")
    assert _states(boot, "units") == {BALANCER: "active", FIRST: "active", SECOND: "active"}
    assert endpoint(boot.one("status")["status"], NAME)["state"] == "ready"
    assert all(r["rc"] == 0 for r in boot.one("chats")["replies"])
    boot.assert_clean()
