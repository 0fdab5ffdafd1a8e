"""The approval record: who approved which fingerprint, when, and exactly what was installed.

One JSON file per endpoint, `STATE_DIR/approvals/NAME.json`, readable by everyone (status
and plans are public; a plan never holds a secret, and its units are public anyway: see
`install.RECORD_MODE`) and written only by an admin.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from epycd.approval.migrate import RECORD_FORMAT, parse_record
from epycd.approval.shape import HostShape
from epycd.errors import InputError
from epycd.names import ENDPOINT_NAME_FIX, is_endpoint_name
from epycd.plan.endpoint import Plan
from epycd.readfile import RECORD_MAX_BYTES, read_bytes
from epycd.settings import Settings
from epycd.text import is_digits

APPROVALS = "approvals"


class Approver(BaseModel):
    uid: int
    user: str
    sudo_uid: int | None = None
    sudo_user: str | None = None

    def describe(self) -> str:
        if self.sudo_user is not None:
            return f"{self.sudo_user} (uid {self.sudo_uid}) via sudo as {self.user}"
        return f"{self.user} (uid {self.uid})"


class UnitRecord(BaseModel):
    path: str
    sha256: str


class Approval(BaseModel):
    """A record as today's code reads it. Records of older shapes reach it through
    `epycd.approval.migrate` (`approval_from_json`), which writes down what each key added
    since meant before it came: the model itself patches nothing."""

    format: Literal[4] = RECORD_FORMAT
    endpoint: str
    unit_name: str
    fingerprint: str
    approved_at: datetime
    approver: Approver
    accepted_unvalidated: bool = False
    endpoint_file_sha256: str | None = None
    host_shape: HostShape
    units: dict[str, UnitRecord]
    plan: Plan
    image_digest: str | None = Field(
        default=None,
        description="a container endpoint's image as the engine held it at approve time "
        "(`image inspect --format {{.Id}}`, sha256:...); None when not present or not asked "
        "(a host endpoint, a record older than the field)",
    )

    def approved_units(self) -> dict[str, str]:
        return dict(self.plan.units)


def approval_from_json(text: str) -> Approval:
    """A record's text, of any format and era this epyc-llm knows, as today's `Approval`
    (`epycd.approval.migrate`): `json.JSONDecodeError`, `ValidationError`, or `InputError`
    for a record of a newer format."""
    return Approval.model_validate(parse_record(text))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path) -> str | None:
    """The file's SHA-256, None when it is missing; for a file that cannot be read (a FIFO,
    a folder, over `RECORD_MAX_BYTES`) a text saying so, which matches no digest."""
    try:
        return hashlib.sha256(read_bytes(path, RECORD_MAX_BYTES)).hexdigest()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def current_approver(environ: dict[str, str] | None = None) -> Approver:
    """The person behind this process. SUDO_* is trusted only when running as root: any
    other user could set those variables to name someone else."""
    env = os.environ if environ is None else environ
    uid = os.geteuid()
    approver = Approver(uid=uid, user=user_name(uid))
    sudo_uid = env.get("SUDO_UID", "")
    if uid == 0 and is_digits(sudo_uid):
        approver.sudo_uid = int(sudo_uid)
        approver.sudo_user = env.get("SUDO_USER") or user_name(int(sudo_uid))
    return approver


def checked_name(name: str) -> str:
    if not is_endpoint_name(name):
        raise InputError(
            f"{name!r} is not an endpoint name",
            fix=f"use the stem of an endpoint file: {ENDPOINT_NAME_FIX}",
        )
    return name


def approvals_dir(settings: Settings) -> Path:
    return settings.state_dir / APPROVALS


def approval_path(settings: Settings, name: str) -> Path:
    return approvals_dir(settings) / f"{checked_name(name)}.json"


def _record_problem(settings: Settings, name: str, approval: Approval) -> str | None:
    """What makes a well-formed record unusable: another endpoint's, or units outside the
    product's folders (removing the endpoint would delete them)."""
    if approval.endpoint != name:
        return f"it is the record of endpoint {approval.endpoint!r}"
    for record in approval.units.values():
        if outside_unit_folders(settings, Path(record.path)):
            return f"unit file {record.path} is outside the product's unit and Quadlet folders"
    return None


def damaged_fix(name: str) -> str:
    return f"`epycctl approve {name}` replaces it, or `epycctl remove {name}` deletes it"


def load_approval(settings: Settings, name: str) -> Approval | None:
    """NAME's approval, None when it has none; an `InputError` naming the file and the fix
    when the record is damaged (cut short, not UTF-8, not JSON, not an approval's shape) or
    written by a newer epyc-llm (a format above `RECORD_FORMAT`). Never rewritten here."""
    path = approval_path(settings, name)
    try:
        data = read_bytes(path, RECORD_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"unreadable: {exc.strerror}", file=path, fix=damaged_fix(name)) from None
    problem: str | None
    try:
        approval = approval_from_json(data.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "not UTF-8 text"
    except json.JSONDecodeError as exc:
        problem = f"not JSON: {exc}"
    except InputError as exc:
        raise InputError(exc.message, file=path, fix=f"{exc.fix}; or {damaged_fix(name)}") from None
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
    else:
        problem = _record_problem(settings, name, approval)
        if problem is None:
            return approval
    raise InputError(
        f"damaged approval record: {problem}", file=path, fix=damaged_fix(name)
    ) from None


def outside_unit_folders(settings: Settings, path: Path) -> bool:
    """Whether `path` is anywhere but directly in the unit or Quadlet folder, or in one
    `*.d` drop-in folder (not a symlink) right below them: the only places units go."""
    if not path.is_absolute() or os.path.normpath(path) != str(path):
        return True
    folders = {Path(os.path.normpath(f)) for f in (settings.unit_dir, settings.quadlet_dir)}
    parent = path.parent
    if parent in folders:
        return False
    return not (parent.parent in folders and parent.name.endswith(".d") and not parent.is_symlink())


def readable_approval(settings: Settings, name: str) -> Approval | None:
    """NAME's approval, or None when it has none, its record is damaged or NAME cannot be an
    endpoint name (an odd endpoint file name): for the commands that replace or delete it,
    and for reading the other endpoints around a damaged one."""
    if not is_endpoint_name(name):
        return None
    try:
        return load_approval(settings, name)
    except InputError:
        return None


def approved_names(settings: Settings) -> list[str]:
    folder = approvals_dir(settings)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json") if is_endpoint_name(p.stem))


def approved_plans(settings: Settings) -> dict[str, Plan]:
    """Endpoint -> its approved plan, for the planner to keep approved endpoints on their
    socket and port, running or not (unreadable records are skipped: their state says so)."""
    plans = {}
    for name in approved_names(settings):
        approval = readable_approval(settings, name)
        if approval is not None:
            plans[name] = approval.plan
    return plans
