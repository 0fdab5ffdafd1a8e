"""The boot-time approval check, run by every endpoint unit before it starts:

    python -m epycd.approval.check NAME [--unit UNIT]

Exit 0 when the endpoint's approval still holds on this host; otherwise one line on stderr
(the journal) naming what changed, and exit 1 (2 when the host files cannot be read).
It refuses first an endpoint the admin stopped (`epycctl stop`) and a unit in a crash loop
(`epycd.approval.crashloop`: UNIT, an instance's `epyc-llm-NAME_N`, or without `--unit` the
endpoint's own `epyc-llm-NAME`), each until `epycctl start NAME`: an ExecCondition= that
exits 1 skips the start without failing the unit, so Restart= ends there, and a reboot
does not start it again.

It does not re-run the planner. The installed units are the approved plan byte for byte
(checked here by hash), so what can make them wrong at boot is the machine under them. The
check re-detects the host (no load sampling, no runtime probing: fast, and free of the
volatile figures the planner also reads, available memory and busy %) and compares the
facts that shaped the plan: CPU identity, the pinned socket's cores, CPU list and NUMA
nodes, and its memory against what the plan needs; then what the endpoint's engine needs of
the host beyond its shape (`epycd.approval.engine_check`: for a host vLLM approved compiled,
without --enforce-eager, that its compile step still has a C++ compiler on systemd's PATH
and the Python headers of the interpreter that serves, docs/tuning.md rule 4, read from
files, the interpreter is not run). Changes of the endpoint file, the model
or data/ are reported by `epycctl status` and the daemon; they do not stop the approved
units, which still run exactly what was approved.
"""

from __future__ import annotations

from pathlib import Path

import click

from epycd.approval.crashloop import read_crash_record, unit_stem, verdict_line
from epycd.approval.engine_check import engine_check
from epycd.approval.gate import run_gate
from epycd.approval.install import journal_path
from epycd.approval.record import Approval, load_approval, sha256_file
from epycd.approval.shape import host_shape, shape_changes
from epycd.errors import EpycError
from epycd.host.detect import detect_host
from epycd.host.facts import HostFacts
from epycd.names import unit_name
from epycd.plan.endpoint import Plan
from epycd.settings import Settings


def stop_marker(settings: Settings, name: str) -> Path:
    """Written by `epycctl stop NAME` (`epycd.status.stop.stop_marker_path`): a Quadlet unit
    cannot be disabled, so this check keeps a stopped endpoint down at boot."""
    return settings.state_dir / "stopped" / f"{name}.json"


def unit_changes(approval: Approval) -> list[str]:
    changes = []
    for record in approval.units.values():
        digest = sha256_file(Path(record.path))
        if digest is None:
            changes.append(f"{record.path} is missing")
        elif digest != record.sha256:
            changes.append(f"{record.path} differs from the approved text")
    return changes


def socket_needs(plan: Plan) -> dict[int, float]:
    """Socket -> the memory the approved plan needs there: a multi-instance set's instances
    each hold their own weights and KV pool, on every socket they use (docs/instances.md)."""
    needs: dict[int, float] = {}
    for server in list(plan.decisions.servers):
        fit = server.cpu_fit
        need = 0.0 if fit is None else fit.required_gb
        needs[server.socket] = needs.get(server.socket, 0.0) + need
    return needs


def check_problems(settings: Settings, name: str, host: HostFacts) -> list[str]:
    """Every reason the approved endpoint must not start, each naming its change (`host`
    read from the settings' host root)."""
    approval = load_approval(settings, name)
    if approval is None:
        return [f"no approval record ({settings.state_dir}/approvals/{name}.json)"]
    problems = []
    if journal_path(settings, name).exists():
        problems.append("an install was interrupted and not finished")
    units = unit_changes(approval)
    if units:
        problems.append("installed units differ from the approval: " + ", ".join(units))
    now = host_shape(host)
    host_changes = list(
        dict.fromkeys(
            change
            for socket, required_gb in socket_needs(approval.plan).items()
            for change in shape_changes(
                approval.host_shape,
                now,
                socket=socket,
                required_gb=required_gb,
                gpus=approval.plan.gpus,
            )
        )
    )
    if host_changes:
        problems.append("host changed since approval: " + ", ".join(host_changes))
    problems += engine_check(approval.plan).problems(approval.plan, host, settings.host_root)
    return problems


def run_check(settings: Settings, name: str, unit: str | None = None) -> tuple[int, str]:
    """(exit code, the one line to print); `unit` is the unit being started when it is not
    the endpoint's own (an instance of a set)."""
    stem = unit_stem(name, unit)
    fix = f"run `epycctl plan {name}` and `epycctl approve {name}`"
    if stop_marker(settings, name).exists():
        return 1, f"{stem}: stopped by the admin; `epycctl start {name}` starts it again"
    crashed = read_crash_record(settings, stem)
    if crashed is not None and crashed.verdict is not None:
        return 1, verdict_line(name, stem, crashed.verdict)
    try:
        host = detect_host(settings.host_root, load_sample_seconds=None, probe_runtimes=False)
        problems = check_problems(settings, name, host)
    except EpycError as exc:
        return exc.exit_code, f"{stem}: approval check failed: {exc}"
    if problems:
        return 1, f"{stem}: {'; '.join(problems)}; {fix}"
    return 0, f"{stem}: host and units match the approval"


@click.command(
    name="epycd-approval-check",
    help="Refuse to start endpoint NAME when the host or its units drifted from its approval, "
    "the admin stopped it, or its unit is in a crash loop.",
)
@click.argument("name")
@click.option(
    "--unit",
    help="the unit being started, epyc-llm-NAME_N for an instance (default: epyc-llm-NAME)",
)
def main(name: str, unit: str | None) -> None:
    run_gate(
        lambda settings, endpoint: run_check(settings, endpoint, unit),
        name,
        f"{unit or unit_name(name)}: approval check failed",
    )


if __name__ == "__main__":
    main()
