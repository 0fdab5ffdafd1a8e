"""Writing an approved plan's units and its approval record so that a crash at any point
leaves the old set or the new set, never a mix that stays and never a partial file.

The install is a small transaction journalled in `STATE_DIR/transactions/NAME.json`:

1. stage: every new unit file and the new approval are written in full next to their
   targets (hidden `.NAME.new.epycd-staged` files, same folder so the rename is atomic),
   each fsynced, and their folders fsynced. A kill here leaves the old files untouched; the
   stray staged files are deleted by the next run (roll back).
2. commit: the journal, listing every target with its staged file and hash (or deletion),
   is written atomically. This rename is the commit point: from here the next run rolls
   forward.
3. apply: the units are renamed onto their targets one by one, old units the new plan no
   longer has are deleted, and the approval is renamed last (each followed by a folder
   fsync). A kill in between leaves new units under the old approval: the boot check and
   `status` see units that differ from the approval and refuse / report it until the next
   `approve` (or the daemon) rolls forward.
4. done: the journal is deleted.

`recover()` is that roll forward / roll back; every writer runs it first under the lock.
A journal only ever names files in the product's own folders (the unit folder, the Quadlet
folder and one `*.d` drop-in level below them, the approvals folder), each staged file next
to its target: a journal that names anything else is refused and left alone, nothing of it
carried out (`check_transaction`), and it affects only its own endpoint.
`remove` uses the same journal with deletions only. The environment variable
`EPYCD_TEST_CRASH_AT=<step>` makes the process SIGKILL itself at that step (test hook).
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from epycd.approval.record import (
    Approval,
    approval_path,
    approvals_dir,
    approved_names,
    checked_name,
    outside_unit_folders,
    readable_approval,
    sha256_file,
    sha256_text,
)
from epycd.atomic import (
    STAGED_SUFFIX,
    fsync_dir,
    make_dirs,
    remove_durable,
    replace_durable,
    staged_path,
    unlink_durable,
    write_atomic,
    write_durable,
)
from epycd.errors import InputError, Refusal
from epycd.names import is_endpoint_name
from epycd.plan.invocation_facts import RECORD_CONTEXT
from epycd.readfile import RECORD_MAX_BYTES, read_bytes
from epycd.settings import Settings

CRASH_ENV = "EPYCD_TEST_CRASH_AT"
STEPS = (
    "unit-staged",
    "approval-staged",
    "journaled",
    "unit-renamed",
    "units-renamed",
    "approval-renamed",
    "done",
)
QUADLET_SUFFIXES = frozenset({".container", ".volume", ".network", ".kube", ".image", ".pod"})
UNIT_PART = re.compile(r"^[A-Za-z0-9@_:-][A-Za-z0-9@_.:-]*$")
TRANSACTIONS = "transactions"
UNIT_MODE = 0o644
"""Units stay world-readable: systemd publishes every unit's settings (ExecStart=,
Environment=) to every local user over D-Bus (`systemctl show`), and warns about unit files
that are not world-readable. So nothing secret ever goes into a unit (the token and key
files are passed by path), and hiding the file would protect nothing."""
RECORD_MODE = 0o644
"""Approval records hold the approved plan, whose units are public anyway (above), and who
approved it: what `epycctl status` shows every user anyway (who approved which plan is
public on this host, on purpose)."""
JOURNAL_MODE = 0o600
"""Journals are read by root's recovery only; status needs only their names."""


class FileChange(BaseModel):
    target: str
    staged: str | None = None
    sha256: str | None = None

    @property
    def is_delete(self) -> bool:
        return self.staged is None


class Transaction(BaseModel):
    endpoint: str
    action: Literal["install", "remove"]
    files: list[FileChange]


def crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def journal_path(settings: Settings, name: str) -> Path:
    return settings.state_dir / TRANSACTIONS / f"{checked_name(name)}.json"


def checked_unit_file(name: str) -> Path:
    """A unit file name from a plan: `x.service` or one drop-in level `x.service.d/y.conf`."""
    parts = name.split("/")
    if (
        len(parts) > 2
        or not all(UNIT_PART.match(p) for p in parts)
        or (len(parts) == 2 and not parts[0].endswith(".d"))
    ):
        raise InputError(f"unsafe unit file name {name!r} in the plan", key="units")
    return Path(*parts)


def default_unit_dir(settings: Settings, name: str) -> Path:
    first = Path(name.split("/")[0].removesuffix(".d"))
    return settings.quadlet_dir if first.suffix in QUADLET_SUFFIXES else settings.unit_dir


def unit_targets(
    settings: Settings, units: dict[str, str], unit_dirs: dict[str, str]
) -> dict[str, Path]:
    """Unit file name -> where it is installed: the plan's folder, else the settings' one."""
    return {
        name: Path(unit_dirs.get(name) or default_unit_dir(settings, name))
        / checked_unit_file(name)
        for name in units
    }


@contextmanager
def state_lock(settings: Settings) -> Iterator[None]:
    make_dirs(settings.state_dir)
    fd = os.open(settings.state_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_transaction(settings: Settings, transaction: Transaction, journal: Path) -> None:
    """Refuse (`InputError`, naming the journal and the entry) a transaction that would touch
    anything but the endpoint's approval and unit files in the product's own folders."""
    fix = (
        "nothing of it was carried out; check who wrote it, delete it "
        f"(rm {journal}) and run `epycctl approve {transaction.endpoint}` or `epycctl remove`"
    )
    if journal.stem != transaction.endpoint:
        raise InputError(
            f"the journal is for endpoint {transaction.endpoint!r}, not {journal.stem!r}",
            file=journal,
            key="endpoint",
            fix=fix,
        )
    record = str(approval_path(settings, transaction.endpoint))
    if not transaction.files or transaction.files[-1].target != record:
        raise InputError(f"its last entry is not {record}", file=journal, key="files", fix=fix)
    others = _units_of_others(settings, transaction.endpoint)
    for index, change in enumerate(transaction.files):
        problem = _change_problem(settings, change, is_record=index == len(transaction.files) - 1)
        if problem is None and change.target in others:
            problem = f"{change.target} is a unit of approved endpoint {others[change.target]}"
        if problem:
            raise InputError(problem, file=journal, key=f"files[{index}]", fix=fix)


def _units_of_others(settings: Settings, name: str) -> dict[str, str]:
    """Unit path -> the other approved endpoint whose record lists it."""
    owners: dict[str, str] = {}
    for other in approved_names(settings):
        approval = readable_approval(settings, other) if other != name else None
        for record in approval.units.values() if approval else []:
            owners[record.path] = other
    return owners


def _change_problem(settings: Settings, change: FileChange, *, is_record: bool) -> str | None:
    target = Path(change.target)
    if not is_record and outside_unit_folders(settings, target):
        return (
            f"{change.target} is outside the product's unit and Quadlet folders "
            f"({settings.unit_dir}, {settings.quadlet_dir})"
        )
    if change.staged is None:
        return None
    staged = Path(change.staged)
    if staged.parent != target.parent or not (
        staged.name.startswith(".") and staged.name.endswith(STAGED_SUFFIX)
    ):
        return f"its staged file {change.staged} is not a staged file next to {change.target}"
    return None


def _write_journal(settings: Settings, transaction: Transaction) -> None:
    path = journal_path(settings, transaction.endpoint)
    check_transaction(settings, transaction, path)
    make_dirs(path.parent)
    write_atomic(path, transaction.model_dump_json(indent=2).encode(), mode=JOURNAL_MODE)


def _apply(settings: Settings, transaction: Transaction) -> None:
    """Roll `transaction` forward; safe to run again after a kill at any point in it."""
    *units, approval = transaction.files
    for index, change in enumerate(units):
        _apply_one(change)
        crash_point("unit-renamed" if index == 0 else "")
    crash_point("units-renamed")
    record = Path(approval.target)
    if record.is_dir() and not record.is_symlink():
        remove_durable(record)  # a folder where the record belongs: what the repair replaces
    _apply_one(approval)
    crash_point("approval-renamed")
    unlink_durable(journal_path(settings, transaction.endpoint))


def _apply_one(change: FileChange) -> None:
    target = Path(change.target)
    if change.staged is None:
        unlink_durable(target)
        return
    staged = Path(change.staged)
    staged_sha = sha256_file(staged)
    if staged_sha == change.sha256:
        replace_durable(staged, target)
    elif sha256_file(target) != change.sha256:
        raise Refusal(
            "an interrupted install cannot be finished: its staged file is gone or altered "
            "and the target is not the journalled text",
            file=target,
            fix="approve the endpoint again (`epycctl approve`)",
        )


def pending_transactions(settings: Settings) -> list[str]:
    """Endpoints with a journal (files whose name cannot be an endpoint's are not ours)."""
    folder = settings.state_dir / TRANSACTIONS
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json") if is_endpoint_name(p.stem))


def _stray_staged(settings: Settings) -> Iterator[Path]:
    for folder in {settings.unit_dir, settings.quadlet_dir, approvals_dir(settings)}:
        if folder.is_dir():
            yield from folder.glob(f".*{STAGED_SUFFIX}")
            for dropins in folder.glob("*.d"):
                if dropins.is_dir() and not dropins.is_symlink():
                    yield from dropins.glob(f".*{STAGED_SUFFIX}")


def interrupted_work(settings: Settings) -> bool:
    """Whether `recover` has anything to do: a journal, or a staged file left behind.
    Read without the lock, so that a command with nothing to recover writes nothing."""
    return bool(pending_transactions(settings)) or next(_stray_staged(settings), None) is not None


def recover(settings: Settings) -> list[str]:
    """Finish every journalled transaction, then delete staged files no journal names.

    Call with the state lock held. Returns one line per repair ("repaired: ...") and per
    journal refused ("refused: ..."), for the person to read. A refused journal stays where
    it is (its endpoint shows as interrupted and does not start) and stops nothing else."""
    done: list[str] = []
    for name in pending_transactions(settings):
        path = journal_path(settings, name)
        try:
            raw = read_bytes(path, RECORD_MAX_BYTES)
            transaction = Transaction.model_validate_json(raw.decode("utf-8"))
        except (OSError, ValueError):
            remove_durable(path)
            done.append(f"repaired: {name}: dropped an unreadable transaction journal {path}")
            continue
        try:
            check_transaction(settings, transaction, path)
        except InputError as exc:
            done.append(f"refused: {exc}")
            continue
        _apply(settings, transaction)
        done.append(f"repaired: {name}: finished an interrupted {transaction.action}")
    for stray in _stray_staged(settings):
        unlink_durable(stray)
        done.append(f"repaired: deleted a half-written file of an interrupted install: {stray}")
    return done


def install(settings: Settings, approval: Approval, previous: Approval | None) -> list[Path]:
    """Write `approval`'s units and the approval itself (see the module docstring).

    Call with the state lock held and after `recover()`. Returns the installed unit paths."""
    units = approval.approved_units()
    targets = {name: Path(record.path) for name, record in approval.units.items()}
    changes: list[FileChange] = []
    for index, (name, text) in enumerate(units.items()):
        target = targets[name]
        make_dirs(target.parent)
        staged = staged_path(target, "new")
        write_durable(staged, text.encode(), UNIT_MODE)
        fsync_dir(staged.parent)
        changes.append(FileChange(target=str(target), staged=str(staged), sha256=sha256_text(text)))
        crash_point("unit-staged" if index == 0 else "")
    kept = {str(path) for path in targets.values()}
    if previous is not None:
        changes += [
            FileChange(target=record.path)
            for record in previous.units.values()
            if record.path not in kept
        ]
    record_path = approval_path(settings, approval.endpoint)
    make_dirs(record_path.parent)
    staged_record = staged_path(record_path, "new")
    record_text = approval.model_dump_json(indent=2, context=RECORD_CONTEXT)
    write_durable(staged_record, record_text.encode(), RECORD_MODE)
    fsync_dir(record_path.parent)
    crash_point("approval-staged")
    changes.append(
        FileChange(
            target=str(record_path), staged=str(staged_record), sha256=sha256_text(record_text)
        )
    )
    transaction = Transaction(endpoint=approval.endpoint, action="install", files=changes)
    _write_journal(settings, transaction)
    crash_point("journaled")
    _apply(settings, transaction)
    crash_point("done")
    return [Path(c.target) for c in changes if not c.is_delete][:-1]


def uninstall(settings: Settings, name: str, unit_paths: list[Path]) -> None:
    """Delete `unit_paths` and NAME's approval as one journalled transaction."""
    files = [FileChange(target=str(p)) for p in unit_paths]
    files.append(FileChange(target=str(approval_path(settings, name))))
    transaction = Transaction(endpoint=name, action="remove", files=files)
    _write_journal(settings, transaction)
    crash_point("journaled")
    _apply(settings, transaction)
