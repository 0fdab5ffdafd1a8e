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
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import inside as base

CONFIG = base.CONFIG
NAME = base.NAME
BALANCER = f"epyc-llm-{NAME}.service"
INSTANCES = tuple(f"epyc-llm-{NAME}_{i}.service" for i in (1, 2))
UNITS = (BALANCER, *INSTANCES)
LOAD_CONCURRENCY = 8
WARMUP_S = 10
AFTER_READY_S = 10
SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def requests_served(port: int) -> float | str:
    """The instance's own count of finished requests (vLLM's Prometheus /metrics)."""
    text = base.instance_metrics(port)
    if isinstance(text, OSError):
        return type(text).__name__
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
    # a set's servers; a vLLM one's port is its typed invocation's (stored once)
    members = approval["plan"]["decisions"]["servers"]
    return [int(m["invocation"]["port"]) for m in members]


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
    approval = json.loads(Path(f"/var/lib/epyc-llm/approvals/{NAME}.json").read_text())
    base.record("route", backend=approval["plan"]["decisions"]["backend"])
    base.record("metrics_before", served=[requests_served(p) for p in ports])
    chats("chats", 8)
    base.record("metrics_after", served=[requests_served(p) for p in ports])
    base.epycctl_status("status", NAME)

    kill_under_load()
    units("units_after_kill")
    base.epycctl_status("status_after_kill", NAME)
    for unit in INSTANCES:
        base.journal(f"journal_after_kill_{unit}", unit)
    base.journal(f"journal_after_kill_{BALANCER}", BALANCER)


class StatusSampler:
    """`epycctl status NAME --json` over and over in a thread: (monotonic time, state, reason,
    the instances' states), to time degraded and back to ready."""

    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.halt.is_set():
            done = base.run("epycctl", "status", NAME, "--json", timeout=60)
            at = time.monotonic()
            try:
                entry = base.endpoint_entry(json.loads(done["stdout"]), NAME)
            except ValueError:
                entry = {}
            self.samples.append({
                "t": at, "state": entry.get("state"), "reason": entry.get("reason", ""),
                "instances": [i.get("state") for i in entry.get("instances", [])],
                "restarts": entry.get("restarts"),
            })  # fmt: skip
            self.halt.wait(1)

    def back_to_ready(self, after: float) -> bool:
        """Degraded (or worse) after `after`, then ready again."""
        later = [s for s in self.samples if s["t"] > after]
        down = next((i for i, s in enumerate(later) if s["state"] != "ready"), None)
        return down is not None and any(s["state"] == "ready" for s in later[down:])


def kill_under_load() -> None:
    """Instance 2 killed (every process of its unit, SIGKILL) while LOAD_CONCURRENCY clients
    keep sending requests through the balancer; the load runs on until the set is ready again
    and AFTER_READY_S more. Every request, the status samples and the kill time are recorded."""
    stop, out = Path("/run/e2e-load.stop"), Path("/run/e2e-load.jsonl")
    url = f"http://127.0.0.1:{CONFIG['port']}/v1"
    load = subprocess.Popen(
        ["/usr/bin/python3", "/opt/e2e/load.py", url, CONFIG["served"],
         str(LOAD_CONCURRENCY), str(stop), str(out)],
        env=base.ENV,
    )  # fmt: skip
    loaded_at = time.monotonic()
    time.sleep(WARMUP_S)
    before = base.member_status(NAME, 1)
    sampler = StatusSampler()
    sampler.thread.start()
    killed_at = time.monotonic()
    base.run("systemctl", "kill", "--signal=SIGKILL", INSTANCES[1], timeout=60, check="kill")
    base.wait_until("the set is ready again", lambda: sampler.back_to_ready(killed_at), 600, 2)
    ready_at = time.monotonic()
    time.sleep(AFTER_READY_S)
    stop.touch()
    load.wait(300)
    sampler.halt.set()
    sampler.thread.join(120)
    requests = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    base.record(
        "kill_under_load",
        loaded_at=loaded_at,
        killed_at=killed_at,
        ready_at=ready_at,
        stopped_at=time.monotonic(),
        startup_before=round(sum(before.get("seconds", {}).values()), 2),
        pid_before=before.get("pid"),
        after=base.member_status(NAME, 1),
        samples=sampler.samples,
        requests=requests,
        restarts=base.show(INSTANCES[1], "NRestarts")["NRestarts"],
    )


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
    base.hang_instance("stop_instance", NAME, 0)
    base.epycctl_status("status_after_stop", NAME)
    chats("chats_after_stop", 2)


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
