"""The units of a multi-instance endpoint (docs/instances.md) from the real planner on fake
hosts, through the real tools: Debian's HAProxy 2.6 checks the configuration (`haproxy -c`),
systemd-analyze verifies every unit (Quadlet 5.4 generates the podman ones first), and
`systemd-analyze security` rates the balancer no worse than the host units."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from epycd.host.facts import DockerFacts, HostFacts, HostVllmFacts, RuntimeFacts
from epycd.plan.endpoint import Plan
from epycd.plan.placement.ports import listening_ports
from epycd.render.balancer import HAPROXY, haproxy_config
from tests.health.realvllm import free_port
from tests.plan.conftest import PODMAN_5, PlanWorkspace, fake_host
from tests.render.fixtures import set_decisions
from tests.render.realtools import quadlet_dryrun, verify, write_units
from tests.render.realtools import test_cache as cache_root
from tests.render.test_security import review

CREDENTIAL = re.compile(r"^SetCredential=haproxy\.cfg:(.*)$", re.M)
MAX_BALANCER_EXPOSURE = 1.8
"""The host endpoint units rate 1.4-1.8; the balancer may not be worse."""


def cached_haproxy() -> tuple[Path, dict[str, str]]:
    root = cache_root() / "haproxy" / "root"
    binary = root / "usr" / "sbin" / "haproxy"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"Debian's HAProxy is missing ({binary}): run tests/bootstrap.sh")
    return binary, {"LD_LIBRARY_PATH": str(root / "usr" / "lib" / "x86_64-linux-gnu")}


def haproxy_check(config: str, folder: Path) -> subprocess.CompletedProcess[str]:
    binary, env = cached_haproxy()
    path = folder / "haproxy.cfg"
    path.write_text(config)
    return subprocess.run(
        [str(binary), "-c", "-f", str(path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def planned(
    tmp_path: Path,
    host_name: str,
    runtimes: RuntimeFacts,
    text: str,
    python: str,
    vllm: Path,
    **plan_args: object,
) -> Plan:
    ws = PlanWorkspace(tmp_path)
    ws.endpoint("multi", text)
    host: HostFacts = fake_host(tmp_path, host_name, runtimes)

    def probe(executable: str) -> HostVllmFacts:
        return HostVllmFacts(path=executable, present=True, version="0.32.0",
                             platform="ZenCpuPlatform")  # fmt: skip

    result = ws.plan(host, probe=probe, product_python=python, **plan_args)["multi"]
    assert result.plan is not None, [e.text for e in result.errors]
    assert result.plan.instance_set is not None
    return result.plan


HOST_SET = 'runtime = "host"\ninstances = "auto"\nplacement = "host"\nport = 8100\n'
DOCKER = RuntimeFacts(docker=DockerFacts(present=True, version="28.2.2", daemon_reachable=True))


@pytest.fixture
def host_set(tmp_path: Path, product_python: str, real_vllm: Path) -> Plan:
    text = HOST_SET + f'vllm = "{real_vllm}"\n'
    return planned(tmp_path, "genoa-9654-2s-nps1", RuntimeFacts(), text, product_python, real_vllm)


def test_the_real_haproxy_accepts_the_configuration(host_set: Plan, tmp_path: Path) -> None:
    config = haproxy_config(set_decisions(host_set))
    assert CREDENTIAL.search(host_set.units["epyc-llm-multi.service"])
    unit_config = CREDENTIAL.search(host_set.units["epyc-llm-multi.service"])
    assert unit_config is not None and unit_config.group(1).replace("\\n", "\n") == config
    done = haproxy_check(config, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = haproxy_check(config.replace("balance leastconn", "balance fewest"), tmp_path)
    assert broken.returncode != 0


def test_every_unit_of_the_set_verifies(host_set: Plan, tmp_path: Path) -> None:
    binary, _ = cached_haproxy()
    units = {n: t.replace(HAPROXY, str(binary)) for n, t in host_set.units.items()}
    assert len(units) == 5
    verify(write_units(tmp_path / "units", units))


def test_docker_set_verifies(tmp_path: Path, product_python: str, real_vllm: Path) -> None:
    plan = planned(tmp_path, "milan-7763-2s", DOCKER, "instances = 2\n", product_python, real_vllm)
    binary, _ = cached_haproxy()
    units = {n: t.replace(HAPROXY, str(binary)) for n, t in plan.units.items()}
    assert sorted(units) == ["epyc-llm-multi.service", "epyc-llm-multi_1.service",
                             "epyc-llm-multi_2.service"]  # fmt: skip
    verify(write_units(tmp_path / "units", units))


@pytest.mark.quadlet
def test_podman_set_passes_quadlet_and_verifies(
    tmp_path: Path, product_python: str, real_vllm: Path
) -> None:
    runtimes = RuntimeFacts(podman=PODMAN_5)
    plan = planned(
        tmp_path, "genoa-9654-2s-nps4", runtimes, 'instances = "auto"\n', product_python, real_vllm
    )
    containers = {n: t for n, t in plan.units.items() if n.endswith(".container")}
    assert len(containers) == 4
    write_units(tmp_path / "quadlet", containers)
    generated = quadlet_dryrun(tmp_path / "quadlet")
    assert set(generated) == {n.replace(".container", ".service") for n in containers}
    binary, _ = cached_haproxy()
    balancer = plan.units["epyc-llm-multi.service"].replace(HAPROXY, str(binary))
    verify(write_units(tmp_path / "all", {**generated, "epyc-llm-multi.service": balancer}))


def test_balancer_exposure_no_worse_than_the_host_units(host_set: Plan, tmp_path: Path) -> None:
    folder = tmp_path / "security"
    folder.mkdir()
    (folder / "epyc-llm-multi.service").write_text(host_set.units["epyc-llm-multi.service"])
    (folder / "epyc-llm-multi_1.service").write_text(host_set.units["epyc-llm-multi_1.service"])
    balancer = review(folder / "epyc-llm-multi.service")
    instance = review(folder / "epyc-llm-multi_1.service")
    assert balancer.exposure <= MAX_BALANCER_EXPOSURE, balancer.output
    assert balancer.exposure <= instance.exposure, (balancer.output, instance.output)


BACKEND = """
import http.server, sys
NAME = sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = NAME.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def wait_until(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _answers(url: str) -> str | None:
    try:
        return httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None


def test_the_real_haproxy_spreads_and_routes_around_a_dead_instance(
    tmp_path: Path, product_python: str, real_vllm: Path
) -> None:
    """Debian's HAProxy with the plan's own configuration in front of two stand-in instances
    (HTTP servers answering /health): requests reach both; one killed, every request from
    then on is answered by the other, before the health check could notice: the refused
    connection is retried on the other instance (`retry-on conn-failure`, `option
    redispatch`) and takes the killed one out at once (`observe layer4`)."""
    port = free_port()
    text = f'runtime = "host"\nvllm = "{real_vllm}"\ninstances = 2\nport = {port}\n'
    plan = planned(
        tmp_path, "vm-zen5-24g", RuntimeFacts(), text, product_python, real_vllm,
        listeners=listening_ports(),
    )  # fmt: skip
    binary, env = cached_haproxy()
    (tmp_path / "haproxy.cfg").write_text(haproxy_config(set_decisions(plan)))
    (tmp_path / "backend.py").write_text(BACKEND)
    assert plan.instance_set is not None
    backends = [
        subprocess.Popen([sys.executable, str(tmp_path / "backend.py"), str(m.port), str(i)])
        for i, m in enumerate(plan.decisions.members, 1)
    ]
    balancer = subprocess.Popen(
        [str(binary), "-f", str(tmp_path / "haproxy.cfg")],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1/models"
    try:
        assert wait_until(lambda: _answers(url) is not None, 30), "HAProxy did not answer"
        assert wait_until(lambda: {_answers(url) for _ in range(10)} == {"1", "2"}, 20)
        backends[1].kill()
        backends[1].wait()
        assert [_answers(url) for _ in range(20)] == ["1"] * 20
    finally:
        for process in [balancer, *backends]:
            process.kill()
            process.wait()
