"""epyc-llm as an admin meets it, on real systemd (PID 1 in systemd-nspawn) with a real vLLM
on the CPU serving a tiny local model. Six boots of one rootfs copy, in order:

install         install.sh (with the user epyc-llm); the model given to its group; epycd
                enabled and active via READY=1; approve -> activating until healthy, then
                active; CPUs and NUMA policy as planned; every process of the endpoint runs
                as epyc-llm; a chat completion; status ready with the URL; a file never
                approved is never installed; systemd-analyze security <= 4.5 on both units
reboot          ready again with no new approval; epycd READY only after the endpoint settled;
                Debian's Prometheus scrapes epycd while chats are served;
                `systemctl reload epycd` works under its sandbox;
                kill -9 of vLLM, then SIGSTOP of vLLM: restarted with no action (docs/healing.md),
                epycd's /metrics saying it is down meanwhile; kill -9 of vLLM's EngineCore,
                of its worker, and the kernel's OOM kill of the EngineCore (the host's
                hands: a memory cgroup) restarted too;
                editing the file is not applied: status changed-needs-approval
edited-reboot   the old approved units still serve; restore the file; `epycctl stop`
stopped-reboot  not started at boot; the weights broken; `epycctl start`: crash-loop
crashloop-reboot nothing starts at boot; weights mended; `epycctl start` serves; point
                epycd.conf at a fake host
fakehost-reboot the changed host: the endpoint refuses at boot with one journal line

Each test asserts on one boot's records; a later test boots the phases before it first.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from epycd.host.cpulist import parse_cpulist
from tests.e2e.conftest import NAME, NEVER, PORT, REPO, Boot, Machine, endpoint, unit_log
from tests.e2e.faultfigures import SLACK_S, WATCHDOG_S, engine_fault, healing_problem

pytestmark = pytest.mark.e2e

UNIT = f"epyc-llm-{NAME}.service"
CRASH_LOOP_RUNS = 3
URL = f"http://127.0.0.1:{PORT}/v1"


def assert_serving(boot: Boot, plan: dict[str, Any]) -> None:
    """The unit is active, its processes are pinned as planned and it answers a chat."""
    unit = boot.one("unit")
    assert (unit["ActiveState"], unit["SubState"]) == ("active", "running"), unit_log(boot)
    processes = boot.one("processes")["processes"]
    assert "epycd.supervisor" in " ".join(processes[0]["cmdline"]), processes[0]
    assert any("vllm" in " ".join(p.get("cmdline", [])) for p in processes[1:]), processes
    nodes = ",".join(map(str, plan["numa_nodes"]))
    cpus = set(parse_cpulist(plan["cpus"]))
    serve = next(p for p in processes if p.get("cmdline", [])[2:3] == ["serve"])
    for proc in (processes[0], serve):
        assert set(parse_cpulist(proc["Cpus_allowed_list"])) == cpus, proc
    threads: set[int] = set()
    for proc in processes:
        if proc.get("gone"):
            continue
        for cpu_list in proc["threads_cpus"]:
            assert set(parse_cpulist(cpu_list)) <= cpus, proc
            threads |= set(parse_cpulist(cpu_list))
        assert set(parse_cpulist(proc["Mems_allowed_list"])) == set(plan["numa_nodes"]), proc
        assert f"bind:{nodes}" in proc["numa_policies"], proc
        assert "default" not in proc["numa_policies"], proc
    omp = set(parse_cpulist(plan["omp_cpus"]))
    assert plan["env"]["VLLM_CPU_OMP_THREADS_BIND"] == plan["omp_cpus"]
    assert omp <= threads <= cpus, "vLLM's threads do not cover the OpenMP bind in the cpuset"
    chat = boot.one("chat")
    assert chat["rc"] == 0, chat["stderr"]
    assert chat["reply"]["choices"] >= 1, chat
    assert chat["reply"]["model"] == NAME


MAX_EXPOSURE = 4.5


def product_uid(install: Boot) -> str:
    """The uid of the user install.sh made (sysusers.d), from `getent passwd epyc-llm`."""
    entry = install.one("product_user")
    assert entry["rc"] == 0, "install.sh made no user epyc-llm"
    return str(entry["stdout"].split(":")[2])


def assert_runs_as_product_user(boot: Boot, uid: str) -> None:
    """The supervisor, vLLM and every child: real, effective, saved and fs uid are epyc-llm's."""
    processes = [p for p in boot.one("processes")["processes"] if not p.get("gone")]
    assert any(p.get("cmdline", [])[2:3] == ["serve"] for p in processes), processes
    for proc in processes:
        assert proc["uid"] == [uid] * 4, (uid, proc)
        assert proc["gid"][0] != "0", proc


def assert_daemon_ready(boot: Boot, endpoint_states: set[str]) -> None:
    """epycd (Type=notify) went active only once the endpoint had left `activating`."""
    epycd = boot.one("epycd")
    assert (epycd["Type"], epycd["ActiveState"]) == ("notify", "active"), epycd
    samples = boot.one("boot_timeline")["samples"]
    for sample in samples:
        if sample["epycd.service"]["ActiveState"] == "active":
            assert sample[UNIT]["ActiveState"] in endpoint_states, sample
    assert samples[-1]["epycd.service"]["ActiveState"] == "active", samples[-1]


@pytest.fixture(scope="module")
def install(machine: Machine) -> Boot:
    return machine.boot("install")


@pytest.fixture(scope="module")
def plan(install: Boot) -> dict[str, Any]:
    done = install.one("plan")
    assert done["rc"] == 0, done["stderr"]
    planned: dict[str, Any] = json.loads(done["stdout"])
    assert planned["runtime"] == "host" and planned["port"] == PORT, planned
    return planned


def test_install_and_approve(install: Boot, plan: dict[str, Any]) -> None:
    install.assert_clean()
    assert install.one("pid1")["comm"] == "systemd"
    for check in ("install", "install_again", "detect"):
        assert install.one(check)["rc"] == 0, install.one(check)["stderr"][-3000:]
    assert install.one("on_path")["found"] == [
        "/usr/local/bin/epycctl",
        "/usr/local/bin/epycd",
    ]
    tmpfiles = install.one("tmpfiles")
    assert tmpfiles["rc"] == 0, tmpfiles["stderr"]
    assert "drwx------" in tmpfiles["stdout"]
    assert install.one("examples")["files"] == sorted(p.name for p in (REPO / "etc").glob("*.toml"))
    epycd = install.one("epycd")
    assert epycd["Type"] == "notify" and epycd["NotifyAccess"] == "main", epycd
    assert (epycd["ActiveState"], epycd["UnitFileState"]) == ("active", "enabled"), epycd
    assert epycd["StatusText"], "epycd sent no STATUS= with READY=1"
    assert install.one("epycd_after_reinstall")["ActiveState"] == "active"

    approve = install.one("approve")
    assert approve["rc"] == 0, approve["stdout"][-2000:] + approve["stderr"][-3000:]
    samples = install.one("approve_timeline")["samples"]
    states = [s[UNIT]["ActiveState"] for s in samples if s[UNIT]["LoadState"] == "loaded"]
    assert "activating" in states, states
    assert states[-1] == "active", states
    first_active = states.index("active")
    assert set(states[first_active:]) == {"active"}, states
    loaded = [s for s in samples if s[UNIT]["LoadState"] == "loaded"]
    activating = [s for s in loaded if s[UNIT]["ActiveState"] == "activating"]
    assert any(s["health"] != 200 for s in activating), "never saw the unit wait for /health"
    assert all(s["health"] == 200 for s in loaded if s[UNIT]["ActiveState"] == "active")
    assert any(s[UNIT]["StatusText"].startswith("loading ") for s in activating), activating
    assert samples[-1][UNIT]["StatusText"], "no STATUS= after READY=1"
    assert any((s["status_file"] or {}).get("state") == "starting" for s in activating)
    assert (samples[-1]["status_file"] or {}).get("state") == "ready", samples[-1]

    assert_serving(install, plan)
    assert_runs_as_product_user(install, product_uid(install))
    tiny = endpoint(install.one("status")["status"], NAME)
    assert (tiny["state"], tiny["url"]) == ("ready", URL), tiny
    never = endpoint(install.one("status")["status"], NEVER)
    assert never["state"] == "pending-approval", never
    files = install.one("files")
    assert files["never_units"] == [] and files["never_unit"]["LoadState"] == "not-found", files
    assert files["approvals"] == [f"{NAME}.json"] and files["unit_enabled"] == "enabled", files


def test_the_model_is_the_groups_and_the_units_are_confined(install: Boot) -> None:
    """The admin's model folder is readable by the group epyc-llm and nobody else, and
    systemd's own reviewer rates the live endpoint unit and epycd.service at most 4.5."""
    listing = install.one("model_perms")
    assert listing["rc"] == 0, listing["stderr"]
    gid = install.one("product_user")["stdout"].split(":")[3]
    for line in listing["stdout"].splitlines()[1:]:
        mode, _links, _owner, group = line.split()[:4]
        if line.endswith(" .."):
            continue
        assert mode[7:10] == "---" and group == gid, line
    scores = install.one("security")["scores"]
    for unit in (UNIT, "epycd.service"):
        [overall] = scores[unit]
        found = re.search(r"exposure level for \S+: (\d+\.\d+)", overall)
        assert found and float(found.group(1)) <= MAX_EXPOSURE, overall


def test_reboot_serves_again_without_a_new_approval(
    machine: Machine, install: Boot, plan: dict[str, Any]
) -> None:
    boot = machine.boot("reboot")
    boot.assert_clean()
    assert_daemon_ready(boot, {"active", "failed"})
    assert "1 ready" in boot.one("epycd")["StatusText"], boot.one("epycd")
    samples = boot.one("boot_timeline")["samples"]
    assert any(
        s["epycd.service"]["ActiveState"] == "activating"
        and f"waiting for {NAME}" in s["epycd.service"]["StatusText"]
        and s[UNIT]["ActiveState"] == "activating"
        for s in samples
    ), "epycd did not wait for the endpoint before READY=1"
    assert_serving(boot, plan)
    assert_runs_as_product_user(boot, product_uid(install))
    assert endpoint(boot.one("status")["status"], NAME)["state"] == "ready"
    before, after = install.one("files"), boot.one("files")
    assert (after["unit_sha"], after["approval_sha"]) == (
        before["unit_sha"],
        before["approval_sha"],
    )


def test_prometheus_scrapes_the_endpoint_and_its_tokens_grow(
    machine: Machine, plan: dict[str, Any]
) -> None:
    """Debian's Prometheus scrapes epycd under its sandbox while the endpoint serves chats."""
    boot = machine.boot("reboot")
    scrape = boot.one("epycd_metrics")
    assert scrape["error"] == "" and scrape["seconds"] < 1.0, scrape
    assert scrape["promtool_rc"] == 0, scrape["promtool_output"]
    prometheus = boot.one("prometheus")
    assert prometheus["scraped"] and prometheus["grown"], prometheus
    assert prometheus["after"] > prometheus["before"], prometheus
    [target] = prometheus["target_up"]
    assert target["value"][1] == "1", target
    [state] = prometheus["state"]
    assert state["metric"]["state"] == "ready", state
    labels = {
        "endpoint": NAME,
        "vllm_instance": "0",
        "socket": str(plan["socket"]),
        "numa_node": ",".join(map(str, plan["numa_nodes"])),
    }
    for series in (prometheus["instance_up"], prometheus["running"]):
        [sample] = series
        assert {k: sample["metric"].get(k) for k in labels} == labels, sample
    assert prometheus["instance_up"][0]["value"][1] == "1"
    names = {entry["metric"]["__name__"] for entry in prometheus["names"]}
    for name in ("vllm_time_to_first_token_seconds_bucket", "vllm_kv_cache_usage_perc",
                 "epyc_llm_plan_kv_cache_bytes", "epyc_llm_instance_startup_seconds"):  # fmt: skip
        assert name in names, sorted(names)
    loads = endpoint(boot.one("status_load")["status"], NAME)["load"]
    assert loads and loads[0]["tokens_per_second"] > 0, loads


def test_a_stopped_engine_reads_as_down_within_a_second(machine: Machine) -> None:
    stopped = machine.boot("reboot").one("metrics_while_stopped")
    assert stopped["error"] == "" and stopped["seconds"] < 1.0, stopped
    [up] = stopped["up"]
    assert up.endswith(" 0.0"), up
    assert stopped["vllm_samples"] == 0, stopped


def test_reload_works_under_the_sandbox(machine: Machine) -> None:
    boot = machine.boot("reboot")
    assert boot.one("reload")["rc"] == 0, boot.one("reload")["stderr"]
    epycd = boot.one("epycd_after_reload")
    assert epycd["ActiveState"] == "active" and epycd["MainPID"] == epycd["main_pid_before"]
    messages = [str(e["message"]) for e in boot.one("journal_epycd_reload")["entries"]]
    reloaded = [i for i, m in enumerate(messages) if m == "reloading (SIGHUP)"]
    assert reloaded, messages[-20:]
    assert any(m.startswith("ready: ") for m in messages[reloaded[-1] :]), messages[-20:]
    assert endpoint(boot.one("status_after_reload")["status"], NAME)["state"] == "ready"


def test_an_edit_is_not_applied(machine: Machine, install: Boot) -> None:
    boot = machine.boot("reboot")
    edited = endpoint(boot.one("status_after_edit")["status"], NAME)
    assert edited["state"] == "changed-needs-approval", edited
    assert any(r.startswith("the plan changed since approval") for r in edited["reasons"]), edited
    assert "max_num_seqs" in (edited["diff"] or ""), edited
    unit = boot.one("unit_after_edit")
    assert unit["ActiveState"] == "active" and unit["MainPID"] == unit["main_pid_before"], unit
    before, after = install.one("files"), boot.one("files_after_edit")
    assert (after["unit_sha"], after["approval_sha"]) == (
        before["unit_sha"],
        before["approval_sha"],
    )
    daemon_log = [e["message"] for e in boot.one("journal_epycd_after_edit")["entries"]]
    assert any(f"{NAME}: changed since approval, not applied" in m for m in daemon_log), daemon_log


def test_after_an_edit_and_a_reboot_the_approved_units_serve(
    machine: Machine, install: Boot, plan: dict[str, Any]
) -> None:
    boot = machine.boot("edited-reboot")
    boot.assert_clean()
    assert_daemon_ready(boot, {"active", "failed"})
    assert boot.one("unit")["ActiveState"] == "active", unit_log(boot)
    assert boot.one("files")["unit_sha"] == install.one("files")["unit_sha"]
    assert endpoint(boot.one("status")["status"], NAME)["state"] == "changed-needs-approval"
    chat = boot.one("chat")
    assert chat["rc"] == 0 and chat["reply"]["choices"] >= 1, chat
    assert endpoint(boot.one("status_restored")["status"], NAME)["state"] == "ready"


def test_stop_keeps_it_down_across_a_reboot(machine: Machine) -> None:
    edited = machine.boot("edited-reboot")
    stop = edited.one("stop")
    assert stop["rc"] == 0, stop["stderr"]
    unit = edited.one("unit_after_stop")
    assert (unit["ActiveState"], unit["UnitFileState"]) == ("inactive", "disabled"), unit
    assert edited.one("pids_after_stop")["alive"] == []
    assert endpoint(edited.one("status_after_stop")["status"], NAME)["state"] == "stopped"

    boot = machine.boot("stopped-reboot")
    boot.assert_clean()
    assert boot.one("epycd")["ActiveState"] == "active"
    assert boot.one("unit")["ActiveState"] == "inactive", boot.one("unit")
    assert boot.one("journal_unit")["entries"] == [], "the stopped endpoint was started at boot"
    status = boot.one("status")["status"]
    assert endpoint(status, NAME)["state"] == "stopped"
    assert endpoint(status, NEVER)["state"] == "pending-approval"
    files = boot.one("files")
    assert files["never_units"] == [] and files["never_unit"]["LoadState"] == "not-found", files
    # `epycctl start` of this stopped endpoint: test_broken_weights_... (it starts on broken
    # weights here, and serves after the next boot once they are mended)


@pytest.mark.parametrize("check", ["kill_engine", "stop_engine"])
def test_a_dead_or_hung_engine_is_restarted_with_no_action(machine: Machine, check: str) -> None:
    """kill -9 of `vllm serve`: the supervisor exits by the same signal and systemd restarts
    the unit; SIGSTOP of every vLLM process: /health stops answering, the supervisor stops its
    WATCHDOG=1 pings and systemd kills and restarts the unit after WatchdogSec=."""
    boot = machine.boot("reboot")
    fault = boot.one(check)
    figures = engine_fault(fault)
    assert fault["victims"], "no vLLM process was found under the supervisor"
    assert figures.to_ready_s is not None, f"not ready again: {fault}\n{unit_log(boot)}"
    bound = SLACK_S
    if check == "stop_engine":
        bound += WATCHDOG_S
        messages = [e["message"] or "" for e in boot.one("journal_faults")["entries"]]
        assert any("Watchdog timeout" in m for m in messages), "systemd's watchdog never fired"
    assert figures.overhead_s is not None and figures.overhead_s <= bound, (figures, bound)
    assert int(figures.restarts) >= 1, "systemd restarted nothing (NRestarts)"
    status = endpoint(boot.one(f"{check}_status")["status"], NAME)
    assert status["state"] == "ready", status
    assert status.get("restarts", 0) >= 1, f"status does not show the restart: {status}"
    assert boot.one(f"{check}_chat")["rc"] == 0
    noticed = [
        e["message"]
        for e in boot.one("journal_epycd_faults")["entries"]
        if (e["message"] or "").startswith(f"{NAME}: ready -> ")
    ]
    assert len(noticed) >= 2, f"epycd did not log the endpoint leaving ready twice: {noticed}"


def test_stops_and_boots_before_the_faults_count_for_nothing(machine: Machine) -> None:
    """The install's poweroff stopped the endpoint and this boot started it: no run
    systemd asked to end, and none that served, is a failed run. Two faults later one more
    would make a crash loop (three runs), as on a Zen 4 machine where the SIGSTOP fault ended
    in `crash-loop`."""
    before = machine.boot("reboot").one("crash_record_before_faults")["record"]
    assert before is None or before["failures"] == [], before


@pytest.mark.parametrize("check", ["kill_engine_core", "kill_worker", "oom_engine_core"])
def test_an_engine_process_that_dies_inside_is_restarted(machine: Machine, check: str) -> None:
    """vLLM's EngineCore or its worker killed (kill -9, or the kernel's OOM killer
    over a memory cgroup's limit): vLLM's API server exits 0, the supervisor makes the run a
    failure and systemd restarts it; ready again within its start-up + 15 s, with no action.
    Before, the unit was "Deactivated successfully" and stayed down."""
    boot = machine.boot("reboot")
    fault = boot.one(check)
    assert len(fault["victims"]) == 1, f"no such vLLM process: {fault['roles']}"
    if check.startswith("oom"):
        assert fault["host"].get("oom_kills", 0) >= 1, fault["host"]
    figures = engine_fault(fault)
    problem = healing_problem(figures, hung=False)
    assert problem is None, f"{problem}: {figures}\n{unit_log(boot)}"
    [failure] = fault["crash_record"]["failures"]
    assert failure["how"] == "exit-code 1", failure
    assert "server exited with status 0 while serving" in failure["reason"], failure
    assert endpoint(boot.one(f"{check}_status")["status"], NAME)["state"] == "ready"
    assert boot.one(f"{check}_chat")["rc"] == 0


def test_broken_weights_end_in_a_crash_loop_that_survives_a_reboot(machine: Machine) -> None:
    """Weights vLLM cannot load: a bounded number of runs, then crash-loop with the first error;
    after a reboot nothing starts (no restart storm); `epycctl start` clears it."""
    boot = machine.boot("stopped-reboot")
    looped = boot.one("crash_loop")
    assert looped["looped"], f"no crash-loop state: {looped}\n{unit_log(boot)}"
    runs = started_servers(boot.one("journal_crash_loop"))
    assert 1 <= runs <= CRASH_LOOP_RUNS, f"{runs} runs on broken weights"
    assert looped["ActiveState"] in {"inactive", "failed"}, looped
    status = endpoint(boot.one("status_crash_loop")["status"], NAME)
    assert status["state"] == "crash-loop", status
    renamed = boot.one("weights_broken")["renamed"]  # vLLM names it without "model."
    assert renamed.removeprefix("model.") in json.dumps(status), f"no first error: {status}"

    after = machine.boot("crashloop-reboot")
    after.assert_clean()
    assert after.one("unit")["ActiveState"] == "inactive", after.one("unit")
    assert started_servers(after.one("journal_unit")) == 0, "a crash-looped endpoint ran at boot"
    assert endpoint(after.one("status")["status"], NAME)["state"] == "crash-loop"
    start = after.one("start")
    assert start["rc"] == 0, start["stdout"] + start["stderr"]
    assert after.one("unit_after_start")["ActiveState"] == "active", unit_log(after)
    assert endpoint(after.one("status_after_start")["status"], NAME)["state"] == "ready"


def started_servers(journal: dict[str, Any]) -> int:
    """How many times the supervisor started vLLM in these journal entries."""
    return sum(1 for e in journal["entries"] if "started server pid" in (e["message"] or ""))


def test_a_changed_host_is_refused_at_boot_in_one_journal_line(machine: Machine) -> None:
    boot = machine.boot("fakehost-reboot")
    boot.assert_clean()
    config = json.loads((machine.results / "config.json").read_text())
    unit = boot.one("unit")
    # the approval check is the unit's ExecCondition= (skipped: inactive) or ExecStartPre=
    refused = {("inactive", "exec-condition"), ("failed", "exit-code")}
    assert (unit["ActiveState"], unit["Result"]) in refused, unit
    ours = [
        e["message"]
        for e in boot.one("journal_unit")["entries"]
        if e["identifier"] != "systemd" and e["comm"] != "systemd"
    ]
    assert len(ours) == 1, ours
    line = ours[0]
    assert line.startswith(f"epyc-llm-{NAME}: host changed since approval: "), line
    assert f"physical cores {config['real_cores']} -> {config['fake_cores']}" in line, line
    assert boot.one("epycd")["ActiveState"] == "active"


# --- journal events (epycd.events; inside.py journal_events), one test per boot ----------


def endpoint_events(boot: Boot, *expected: str) -> dict[str, list[dict[str, Any]]]:
    """The boot's journal entries of each event for the endpoint, `expected` ones present."""
    found = boot.one("events")
    assert found["missing"] == [], f"no journal event {found['missing']} for {NAME}: {found}"
    events = {
        event: [e for e in entries if e.get("ENDPOINT") == NAME]
        for event, entries in found["events"].items()
    }
    for event in expected:
        assert events[event], (event, found)
        for entry in events[event]:
            assert entry["MESSAGE"], entry
    return events


def test_install_journal_events(install: Boot) -> None:
    """`journalctl MESSAGE_ID=` finds the approve and install of epycctl and epycd's ready."""
    events = endpoint_events(install, "approve", "install", "ready")
    for entry in events["approve"] + events["install"]:
        assert (entry["SYSLOG_IDENTIFIER"], entry["PRIORITY"]) == ("epycctl", "6"), entry
        assert "STATE" not in entry and "INSTANCE" not in entry, entry
    assert all(e["REASON"].startswith("by root (uid 0) (") for e in events["approve"])
    assert all(UNIT in e["REASON"] for e in events["install"]), events["install"]
    for entry in events["ready"]:
        assert (entry["SYSLOG_IDENTIFIER"], entry["STATE"]) == ("epycd", "ready"), entry


def test_reboot_journal_events(machine: Machine) -> None:
    """After kill -9, SIGSTOP and the edit: epycd's ready, restart, unhealthy and drift."""
    boot = machine.boot("reboot")
    events = endpoint_events(boot, "ready", "restart", "unhealthy", "drift")
    for event in ("ready", "restart", "unhealthy", "drift"):
        for entry in events[event]:
            assert entry["SYSLOG_IDENTIFIER"] == "epycd" and entry["STATE"], entry
            assert "INSTANCE" not in entry, entry
    assert {e["STATE"] for e in events["ready"]} == {"ready"}
    assert {e["PRIORITY"] for e in events["restart"] + events["unhealthy"]} == {"4"}
    down = [e for e in events["unhealthy"] if e["STATE"] != "ready"]
    assert down, f"no unhealthy event for the endpoint leaving ready: {events['unhealthy']}"
    for entry in down:
        assert entry["STATE"].split(":")[0] in {"starting", "failed", "approved"}, entry
    [drift] = events["drift"]
    assert (drift["STATE"], drift["PRIORITY"]) == ("changed-needs-approval", "5"), drift
    assert drift["REASON"].startswith("the plan changed since approval"), drift


def test_stop_journal_event(machine: Machine) -> None:
    boot = machine.boot("edited-reboot")
    [stop] = endpoint_events(boot, "stop")["stop"]
    assert (stop["SYSLOG_IDENTIFIER"], stop["STATE"]) == ("epycctl", "stopped"), stop
    assert stop["REASON"] == "by root (uid 0)", stop


def test_start_journal_event(machine: Machine) -> None:
    """`epycctl start` of the stopped endpoint (on broken weights: the start is the admin's,
    the crash loop that follows is epycd's unhealthy and restart)."""
    boot = machine.boot("stopped-reboot")
    events = endpoint_events(boot, "start")
    starts = [e for e in events["start"] if e["SYSLOG_IDENTIFIER"] == "epycctl"]
    assert [e["REASON"] for e in starts] == ["by root (uid 0)"], events["start"]
    assert "STATE" not in starts[0], starts
