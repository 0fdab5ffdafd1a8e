"""The admin's side of the multi-instance end-to-end test (tests/e2e/test_instances.py),
run inside the booted machine by a oneshot unit; the helpers are inside.py's.

install: the product, Debian's HAProxy (.debs from the test cache), an endpoint of 2
instances x 1 core behind it; approve; both instances and the balancer up; requests through
the balancer reach both (each instance's vLLM /metrics); instance 2 killed: status says
degraded and the balancer answers from instance 1. reboot: the set comes back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import inside as base

CONFIG = base.CONFIG
NAME = base.NAME
BALANCER = f"epyc-llm-{NAME}.service"
INSTANCES = tuple(f"epyc-llm-{NAME}_{i}.service" for i in (1, 2))
UNITS = (BALANCER, *INSTANCES)
SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def requests_served(port: int) -> float | str:
    """The instance's own count of finished requests (vLLM's Prometheus /metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError as exc:
        return type(exc).__name__
    return sum(float(value) for value in SUCCESS.findall(text))


def chats(check: str, count: int) -> None:
    """`count` chat requests through the balancer, 2 at a time."""
    replies = []
    for _ in range(count // 2):
        batch = [
            subprocess.Popen(
                [
                    CONFIG["client_python"],
                    "-c",
                    base.CHAT,
                    f"http://127.0.0.1:{CONFIG['port']}/v1",
                    CONFIG["served"],
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=base.ENV,
            )
            for _ in range(2)
        ]
        for process in batch:
            out, err = process.communicate(timeout=180)
            replies.append({"rc": process.returncode, "out": out[-500:], "err": err[-1500:]})
    base.record(check, replies=replies)


def members() -> list[int]:
    approval = json.loads(Path(f"/var/lib/epyc-llm/approvals/{NAME}.json").read_text())
    return [int(m["port"]) for m in approval["plan"]["instances"]["members"]]


def units(check: str) -> None:
    base.record(check, units={unit: base.show(unit) for unit in UNITS})


def phase_install() -> None:
    base.must("install", "/src/packaging/install.sh", timeout=900)
    debs = sorted(str(p) for p in Path("/haproxy-debs").glob("*.deb"))
    base.must("haproxy", "dpkg", "-i", *debs, timeout=300)
    base.run("systemctl", "disable", "--now", "haproxy.service", timeout=60, check="no_default")
    base.give_model_to_group()
    base.use_identity_root()
    Path(f"/etc/epyc-llm/{NAME}.toml").write_text(CONFIG["endpoint_toml"])
    base.run("epycctl", "plan", NAME, timeout=300, check="plan")
    approve = base.run("epycctl", "approve", NAME, "--yes", *CONFIG["consent_args"],
                       timeout=900, check="approve")  # fmt: skip
    units("units")
    for unit in UNITS:
        base.journal(f"journal_{unit}", unit)
    if approve["rc"] != 0:
        raise base.PhaseFailed(f"approve failed: {approve['stderr'][-2000:]}")
    ports = members()
    base.record("metrics_before", served=[requests_served(p) for p in ports])
    chats("chats", 8)
    base.record("metrics_after", served=[requests_served(p) for p in ports])
    base.epycctl_status("status", NAME)

    base.run("systemctl", "kill", "--signal=SIGKILL", INSTANCES[1], timeout=60, check="kill")
    base.wait_until(
        "instance 2 down",
        lambda: base.show(INSTANCES[1], "ActiveState")["ActiveState"] in {"failed", "inactive"},
        60,
    )
    time.sleep(6)  # HAProxy's check: every 2 s, 2 failures take the instance out
    units("units_after_kill")
    base.epycctl_status("status_after_kill", NAME)
    chats("chats_after_kill", 4)


def phase_reboot() -> None:
    base.wait_until(
        "the balancer settles",
        lambda: base.show(BALANCER, "ActiveState")["ActiveState"] in {"active", "failed"},
        600,
        every=2,
    )
    units("units")
    base.epycctl_status("status", NAME)
    chats("chats", 2)


PHASES = {"install": phase_install, "reboot": phase_reboot}


def main() -> None:
    base.record("start", phase=base.PHASE)
    try:
        PHASES[base.PHASE]()
    except base.PhaseFailed as failed:
        base.record("error", reason=str(failed))
    except Exception:
        base.record("error", traceback=traceback.format_exc())
    finally:
        base.record("done")
        subprocess.run(["systemctl", "poweroff", "--no-block"], check=False)


if __name__ == "__main__":
    main()
