"""systemd's own reviewer on the units the product writes: `systemd-analyze security
--offline=yes --threshold=45` (exposure <= 4.5) passes for every host endpoint unit of the
golden fixtures and of the real planner on the fake hosts, for the docker units, and for
epycd.service; every check a unit fails has its reason beside the renderer
(epycd.render.sandbox) or in epycd.service's comments."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from epycd.host.facts import HostFacts, HostVllmFacts
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.plan.model import AnyServer
from epycd.render.sandbox import DOCKER_LEFT_OUT, HOST_LEFT_OUT, PRODUCT_USER
from tests.hosts import CATALOGUE
from tests.plan.conftest import PlanWorkspace
from tests.render.fixtures import CASES, units_of
from tests.secrets import root_folder, write_secret

THRESHOLD = "45"
MAX_EXPOSURE = 4.5
REPO = Path(__file__).resolve().parents[2]
EPYCD_SERVICE = REPO / "units" / "epycd.service"
OVERALL = re.compile(r"Overall exposure level for \S+: (\d+\.\d+)")


@dataclass
class Review:
    returncode: int
    exposure: float
    failed_checks: list[str]
    output: str


def review(unit: Path) -> Review:
    """`systemd-analyze security --offline=yes --threshold=45 UNIT`, as an admin runs it."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: run tests/bootstrap.sh (apt-get install systemd)")
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", f"--threshold={THRESHOLD}", unit.name],
        cwd=unit.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = OVERALL.search(done.stdout)
    assert found, f"no overall exposure for {unit}:\n{done.stdout}\n{done.stderr}"
    failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("✗ ")]
    return Review(done.returncode, float(found.group(1)), failed, done.stdout)


def reviewed(units: dict[str, str], folder: Path) -> dict[str, Review]:
    folder.mkdir(parents=True, exist_ok=True)
    reviews = {}
    for name, text in units.items():
        (folder / name).write_text(text, encoding="utf-8")
        reviews[name] = review(folder / name)
    return reviews


def assert_confined(decisions: EndpointDecisions | AnyServer, folder: Path) -> float:
    [(name, result)] = reviewed(units_of(decisions), folder).items()
    assert result.returncode == 0, f"{name}: exposure {result.exposure}\n{result.output}"
    assert result.exposure <= MAX_EXPOSURE, result.output
    reasons = HOST_LEFT_OUT if decisions.runtime == "host" else DOCKER_LEFT_OUT
    unexplained = [check for check in result.failed_checks if check not in reasons]
    assert not unexplained, f"{name}: no reason written for {unexplained}"
    return result.exposure


SERVICE_CASES = sorted(name for name, case in CASES.items() if case().runtime != "podman")


@pytest.mark.parametrize("case", SERVICE_CASES)
def test_golden_units_pass_systemd_analyze_security(case: str, tmp_path: Path) -> None:
    assert_confined(CASES[case](), tmp_path)


def zen(executable: str) -> HostVllmFacts:
    return HostVllmFacts(path=executable, present=True, version="0.32.0", platform="ZenCpuPlatform")


HOSTS = sorted(name for name in CATALOGUE if name != "xeon")


def plan_local_and_open(
    ws: PlanWorkspace, host: HostFacts, vllm: str, key: Path
) -> dict[str, Plan]:
    files = {
        "local": f'model = "{ws.model}"\nruntime = "host"\nvllm = "{vllm}"\n',
        "open": f'model = "{ws.model}"\nruntime = "host"\nvllm = "{vllm}"\n'
        f'host = "0.0.0.0"\napi_key_file = "{key}"\n',
    }
    plans: dict[str, Plan] = {}
    for name, text in files.items():
        for old in ws.config_dir.glob("*.toml"):
            old.unlink()
        ws.endpoint(name, text)
        result = ws.plan(host, probe=zen)[name]
        assert result.plan is not None, result.errors
        plans[name] = result.plan
    return plans


@pytest.mark.parametrize("host_name", HOSTS)
def test_fake_host_plans_pass_systemd_analyze_security(
    host_name: str,
    ws: PlanWorkspace,
    host_of: Callable[..., HostFacts],
    tmp_path: Path,
) -> None:
    """The real planner's host units: a local model on loopback (loopback-only IP rules)
    and one listening on every interface (its key in a folder only root controls)."""
    vllm = "/opt/zen/bin/vllm"
    with root_folder() as secrets:
        key = write_secret(secrets / "key", "k\n")
        plans = plan_local_and_open(ws, host_of(host_name), vllm, key)
    units = {}
    for name, plan in plans.items():
        assert plan is not None
        assert_confined(plan.decisions, tmp_path / name)
        units[name] = next(iter(plan.units.values()))
    assert "IPAddressDeny=any" in units["local"] and f"User={PRODUCT_USER}" in units["local"]
    assert "IPAddressDeny" not in units["open"]


def test_epycd_service_passes_and_says_why_for_each_failed_check(tmp_path: Path) -> None:
    [(_name, result)] = reviewed(
        {"epycd.service": EPYCD_SERVICE.read_text(encoding="utf-8")}, tmp_path
    ).items()
    assert result.returncode == 0 and result.exposure <= MAX_EXPOSURE, result.output
    comments = [
        line for line in EPYCD_SERVICE.read_text(encoding="utf-8").splitlines() if line[:1] == "#"
    ]
    unexplained = [
        check
        for check in result.failed_checks
        if not any(line.startswith(f"# - {check}:") for line in comments)
    ]
    assert not unexplained, f"epycd.service gives no reason for {unexplained}"


def test_the_old_unprotected_units_fail_the_threshold(tmp_path: Path) -> None:
    """The reviewer does fail a unit without the sandbox (9.6): the test can fail."""
    text = next(iter(units_of(CASES["host-vllm"]()).values()))
    bare = "\n".join(line for line in text.splitlines() if not line.startswith(SANDBOX_KEYS))
    [(_name, result)] = reviewed({"bare.service": bare + "\n"}, tmp_path).items()
    assert result.returncode != 0 and result.exposure > MAX_EXPOSURE


SANDBOX_KEYS = tuple(
    f"{key}="
    for key in (
        "User", "Group", "RemoveIPC", "ProtectHome", "NoNewPrivileges", "ProtectSystem",
        "PrivateTmp", "PrivateDevices", "PrivateIPC", "PrivateMounts", "ProtectKernelTunables",
        "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock",
        "ProtectHostname", "ProtectProc", "RestrictNamespaces", "RestrictRealtime",
        "RestrictSUIDSGID", "LockPersonality", "RestrictAddressFamilies",
        "SystemCallArchitectures", "SystemCallFilter", "SystemCallErrorNumber",
        "CapabilityBoundingSet", "AmbientCapabilities", "UMask", "IPAddress",
    )
)  # fmt: skip
