"""The steps of `approve` and `remove` after the person said yes: gate, record, pull,
install, systemd. The CLI asks; these do.

Image pull: done for every container path, with or without `--no-start`, because the units
use `Pull=never` (boot never waits on a registry) and an image-build that writes units for
the next boot needs the image in place; `no_pull` skips it for images preloaded otherwise.
Then the image the engine holds is recorded in the approval (`image_digest`), or None when it
is not present.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from epycd import systemd
from epycd.approval.crashloop import clear_crash_records, recorded_stems
from epycd.approval.install import (
    install,
    interrupted_work,
    recover,
    state_lock,
    uninstall,
    unit_targets,
)
from epycd.approval.record import (
    Approval,
    Approver,
    UnitRecord,
    approval_path,
    approved_names,
    readable_approval,
    sha256_file,
    sha256_text,
)
from epycd.approval.shape import host_shape
from epycd.approval.state import endpoint_unit_files
from epycd.atomic import named_for_target
from epycd.childproc import run_bounded
from epycd.errors import EpycError, InputError, Refusal, file_error
from epycd.events import EPYCCTL, Event, emit
from epycd.host.cpulist import format_cpulist, parse_cpulist
from epycd.host.facts import HostFacts
from epycd.names import unit_name
from epycd.plan.endpoint import EndpointDecisions, Plan
from epycd.render.on_demand import proxy_file, socket_file
from epycd.settings import Settings

QUADLET_SUFFIX = ".container"
INSPECT_TIMEOUT_S = 30
START_MARGIN_S = 30
ACTIVE_STATES = frozenset({"active", "activating", "reloading", "deactivating"})


def memory_short(decisions: EndpointDecisions) -> str | None:
    """Why the CPU endpoint (a set's worst member) does not fit its socket's memory; None
    when it does."""
    fit = decisions.cpu_fit
    if fit is None or fit.fits:
        return None
    instance = decisions.tightest_server
    return (
        f"does not fit: needs {fit.required_gb:g} GiB, socket {instance.socket} has "
        f"{fit.available_gb:g} GiB available"
    )


def _fit_action(decisions: EndpointDecisions) -> str | None:
    fit = decisions.cpu_fit
    return None if fit is None else fit.action


def gate(plan: Plan, *, accept_unvalidated: bool) -> None:
    """Refuse (exit 1) a plan that must not be installed as it is."""
    fix = f"see `epycctl plan {plan.endpoint}`"
    if plan.decisions.errors:
        raise Refusal(
            "the plan has errors: " + "; ".join(p.text for p in plan.decisions.errors), fix=fix
        )
    if (short := memory_short(plan.decisions)) is not None:
        raise Refusal(short, fix=_fit_action(plan.decisions) or fix)
    if plan.decisions.requires_confirmation and not accept_unvalidated:
        raise Refusal(
            "needs explicit consent: " + "; ".join(plan.decisions.confirmation_reasons),
            fix="read the reasons, then approve with --accept-unvalidated",
        )


def make_approval(
    settings: Settings,
    plan: Plan,
    host: HostFacts,
    approver: Approver,
    *,
    accepted_unvalidated: bool,
    now: datetime | None = None,
) -> Approval:
    targets = unit_targets(settings, plan.units, plan.unit_dirs)
    return Approval(
        endpoint=plan.endpoint,
        unit_name=plan.unit_name,
        fingerprint=plan.fingerprint,
        approved_at=now or datetime.now(UTC),
        approver=approver,
        accepted_unvalidated=accepted_unvalidated and plan.decisions.requires_confirmation,
        endpoint_file_sha256=sha256_file(Path(plan.decisions.config_file)),
        host_shape=host_shape(host),
        units={
            name: UnitRecord(path=str(targets[name]), sha256=sha256_text(text))
            for name, text in plan.units.items()
        },
        plan=plan,
    )


def pull_image(plan: Plan) -> None:
    """`podman pull` / `docker pull` with its progress on this terminal."""
    runtime, image = plan.decisions.runtime, plan.decisions.image
    if runtime == "host" or not image:
        return
    tool = shutil.which(runtime)
    if tool is None:
        raise Refusal(f"`{runtime}` not found on PATH to pull {image}")
    done = subprocess.run([tool, "pull", image], check=False)
    if done.returncode != 0:
        raise Refusal(
            f"`{runtime} pull {image}` failed (exit {done.returncode}); nothing was installed",
            fix="check the registry is reachable, or load the image and use --no-pull",
        )


def image_digest(plan: Plan) -> str | None:
    """The image the engine holds under the plan's reference now (`image inspect --format
    {{.Id}}`: the sha256 of the image's config, the same in podman and docker), recorded in
    the approval so that what it binds does not float with a later pull; None for a host
    endpoint, an image not present, or an engine that does not answer."""
    if plan.decisions.runtime == "host" or not plan.decisions.image:
        return None
    tool = shutil.which(plan.decisions.runtime)
    if tool is None:
        return None
    argv = [tool, "image", "inspect", "--format", "{{.Id}}", plan.decisions.image]
    try:
        done = run_bounded(argv, timeout=INSPECT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    found = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(found) != 1:
        return None
    digest = found[0].removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        return None
    return f"sha256:{digest}"


def is_quadlet(file_name: str) -> bool:
    return "/" not in file_name and file_name.endswith(QUADLET_SUFFIX)


def units_to_enable(approval: Approval) -> list[str]:
    """Plain unit files with an [Install] section. Quadlet-generated services cannot be
    enabled: the [Install] section of the .container decides."""
    return [
        name
        for name, text in approval.approved_units().items()
        if "/" not in name and not is_quadlet(name) and "[Install]" in text
    ]


def main_service(approval: Approval) -> str:
    """The unit that starts the endpoint: its own, or an on-demand endpoint's socket."""
    if approval.plan.decisions.on_demand is not None:
        return socket_file(approval.endpoint)
    return f"{approval.unit_name}.service"


def running_units(approval: Approval) -> list[str]:
    """What runs while an on-demand endpoint serves: its proxy and its engine; nothing
    beside the main unit for any other."""
    if approval.plan.decisions.on_demand is None:
        return []
    return [proxy_file(approval.endpoint), f"{approval.unit_name}.service"]


@contextmanager
def file_errors_refused() -> Iterator[None]:
    """A folder the user may not write, or a full disk, is a clear refusal naming the file,
    not a traceback."""
    try:
        yield
    except OSError as exc:
        raise file_error(named_for_target(exc), "cannot write") from None


def recover_interrupted(settings: Settings) -> list[str]:
    """Finish or undo whatever a killed approve/remove left, under the state lock; nothing
    at all (not even the lock file) when nothing was left."""
    if not interrupted_work(settings):
        return []
    with file_errors_refused(), state_lock(settings):
        return recover(settings)


def install_approval(settings: Settings, approval: Approval) -> tuple[list[str], list[Path]]:
    """Under the state lock: finish interrupted work, refuse a plan that overlaps another
    approval (as read under the lock: a racing `approve` is seen), then install.
    (repairs, unit paths)"""
    with file_errors_refused(), state_lock(settings):
        repairs = recover(settings)
        refuse_overlap(settings, approval)
        previous = readable_approval(settings, approval.endpoint)
        try:
            return repairs, install(settings, approval, previous)
        except OSError:
            finish_or_undo(settings)
            raise


@dataclass(frozen=True)
class Installed:
    """What the install transaction did: the approval it replaced, the unit files written."""

    previous: Approval | None
    paths: list[Path]


def install_approved(
    settings: Settings,
    approval: Approval,
    *,
    pull: bool,
    touch_systemd: bool,
    log: Callable[[str], None],
) -> Installed:
    """The install transaction of `approve` and `quickstart`, after the person's yes: pull
    the image, disable the units the new approval drops (when systemd is touched), then
    write the units and the record under the state lock. Interrupted work is recovered once
    before planning (`recover_interrupted`), and again under the lock by `install_approval`."""
    previous = readable_approval(settings, approval.endpoint)
    if pull:
        pull_image(approval.plan)
    approval.image_digest = image_digest(approval.plan)
    if touch_systemd:
        disable_dropped(previous, approval, log)
    repairs, paths = install_approval(settings, approval)
    for line in repairs:
        log(line)
    for stem in clear_crash_records(settings, recorded_stems(settings, approval.endpoint)):
        log(f"cleared the crash loop of {stem}: the new approval starts afresh")
    name, by = approval.endpoint, approval.approver.describe()
    approved = f"approved {name} by {by} ({approval.fingerprint[:12]})"
    log(approved)
    emit(
        Event.APPROVE,
        name,
        approved,
        identifier=EPYCCTL,
        reason=f"by {by} ({approval.fingerprint[:12]})",
    )
    for path in paths:
        log(f"wrote {path}")
    wrote = ", ".join(str(path) for path in paths)
    emit(
        Event.INSTALL,
        name,
        f"installed {name}: {wrote}",
        identifier=EPYCCTL,
        reason=f"wrote {wrote}",
    )
    gateway_updated(settings, log, reload=touch_systemd)
    return Installed(previous, paths)


def gateway_updated(settings: Settings, log: Callable[[str], None], *, reload: bool) -> None:
    """The gateway's routes after an endpoint's approval or removal (docs/gateway.md); a
    failure there is said, and the endpoint's change stands."""
    from epycd.gateway.apply import refresh

    line = refresh(settings, reload=reload)
    if line is not None:
        log(line)


def finish_or_undo(settings: Settings) -> None:
    """After a failed write (a full disk, a read-only folder): delete what was staged, or
    finish what was committed, so nothing half-done stays; a recovery that fails too leaves
    it to the next run, and the first error is the one reported."""
    with contextlib.suppress(OSError, EpycError):
        recover(settings)


def plan_ports(plan: Plan) -> set[int]:
    """The endpoint's port and its servers' (a set's instances, an on-demand engine)."""
    return {plan.decisions.port, *(server.port for server in plan.decisions.servers)}


def swaps_with(plan: Plan, other: Plan) -> bool:
    """Both on demand, in one swap group: their engines never run together."""
    mine, theirs = plan.decisions.on_demand, other.decisions.on_demand
    return mine is not None and theirs is not None and other.endpoint in mine.swap_group


def overlap(plan: Plan, other: Plan) -> list[str]:
    """What two plans would both use: the port, CPUs (which a swap group shares)."""
    clashes = []
    shared_ports = sorted(plan_ports(plan) & plan_ports(other))
    if shared_ports:
        clashes.append(f"port {', '.join(map(str, shared_ports))}")
    shared = set(parse_cpulist(plan.decisions.cpus)) & set(parse_cpulist(other.decisions.cpus))
    if shared and not swaps_with(plan, other):
        clashes.append(f"CPUs {format_cpulist(sorted(shared))}")
    return clashes


def refuse_overlap(settings: Settings, approval: Approval) -> None:
    """Refuse (exit 1) when another approved endpoint, running or not, holds the plan's port
    or any of its CPUs: two approvals never share them."""
    name = approval.endpoint
    for other_name in approved_names(settings):
        other = readable_approval(settings, other_name) if other_name != name else None
        clashes = overlap(approval.plan, other.plan) if other is not None else []
        if clashes:
            raise Refusal(
                f"{name}'s plan uses {' and '.join(clashes)} of approved endpoint "
                f"{other_name}; nothing was written",
                fix=f"run `epycctl approve {name}` again (a plan made now keeps off "
                f"{other_name}'s), or approve or remove {other_name} first",
            )


def dropped_units(previous: Approval | None, approval: Approval) -> list[str]:
    """Enabled-able units of the previous approval the new one no longer installs: disabled
    before their files go, so no dangling wants/ link is left behind."""
    if previous is None:
        return []
    return [name for name in units_to_enable(previous) if name not in approval.units]


def disable_dropped(
    previous: Approval | None, approval: Approval, log: Callable[[str], None]
) -> None:
    dropped = [u for u in dropped_units(previous, approval) if systemd.is_enabled(u) == "enabled"]
    if dropped:
        log("systemctl disable " + " ".join(dropped))
        systemd.disable(dropped)


def start_wait_s(approval: Approval) -> int:
    """How long `systemctl start` may block: the unit's own TimeoutStartSec (the plan's
    start timeout) and a margin for systemd's reply."""
    return approval.plan.decisions.start_timeout_s + START_MARGIN_S


def start_approved(
    approval: Approval, previous: Approval | None, log: Callable[[str], None]
) -> None:
    """daemon-reload, enable, then start; restart instead when the units changed, since
    `start` leaves a running endpoint on its old units."""
    timeout = start_wait_s(approval)
    log("systemctl daemon-reload")
    systemd.daemon_reload()
    enable = units_to_enable(approval)
    if enable:
        log("systemctl enable " + " ".join(enable))
        systemd.enable(enable)
    service = main_service(approval)
    unchanged = previous is not None and previous.units == approval.units
    running = running_units(approval)
    if running:
        if not unchanged:
            log("systemctl stop " + " ".join(running) + " (the next request starts the new units)")
            systemd.stop(running)
        log(f"systemctl start {service} (the first request starts the engine)")
        systemd.start([service], timeout=timeout)
        return
    verb = "start" if unchanged else "restart"
    log(f"systemctl {verb} {service} (waits for the health gate)")
    (systemd.start if unchanged else systemd.restart)([service], timeout=timeout)


def removal_files(settings: Settings, name: str, approval: Approval | None) -> list[Path]:
    paths = {Path(r.path) for r in approval.units.values()} if approval else set()
    paths |= set(endpoint_unit_files(settings, name))
    return sorted(p for p in paths if p.exists() or p.is_symlink())


def stop_endpoint(
    approval: Approval | None, name: str, files: list[Path], log: Callable[[str], None]
) -> None:
    service = main_service(approval) if approval else f"{unit_name(name)}.service"
    services = [service, *(running_units(approval) if approval else [])]
    active = [unit for unit in services if systemd.is_active(unit) in ACTIVE_STATES]
    if active:
        log("systemctl stop " + " ".join(active))
        systemd.stop(active)
    plain = [p.name for p in files if p.suffix != QUADLET_SUFFIX and p.parent.suffix != ".d"]
    enabled = [u for u in plain if systemd.is_enabled(u) == "enabled"]
    if enabled:
        log("systemctl disable " + " ".join(enabled))
        systemd.disable(enabled)


def remove_endpoint(
    settings: Settings, name: str, *, touch_systemd: bool, log: Callable[[str], None]
) -> list[Path]:
    """Stop and disable, delete the units and the approval (one journalled transaction),
    then daemon-reload. Returns the deleted unit files."""
    with file_errors_refused(), state_lock(settings):
        for line in recover(settings):
            log(line)
        approval = readable_approval(settings, name)
        files = removal_files(settings, name, approval)
        if approval is None and not files and not approval_path(settings, name).exists():
            raise InputError(
                f"nothing to remove: no approval and no units for {name}",
                fix="`epycctl status` lists the endpoints",
            )
        if touch_systemd:
            stop_endpoint(approval, name, files, log)
        try:
            uninstall(settings, name, files)
        except OSError:
            finish_or_undo(settings)
            raise
        clear_crash_records(settings, recorded_stems(settings, name))
    if touch_systemd:
        log("systemctl daemon-reload")
        systemd.daemon_reload()
    gateway_updated(settings, log, reload=touch_systemd)
    return files
