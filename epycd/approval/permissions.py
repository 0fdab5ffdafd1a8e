"""Who may change what runs: root, or members of `Settings.admin_group`. Reading status and
plans is open to everyone."""

from __future__ import annotations

import grp
import os

from epycd.approval.record import user_name
from epycd.errors import Refusal
from epycd.settings import Settings


def is_admin(settings: Settings) -> bool:
    uid = os.geteuid()
    if uid == 0:
        return True
    if not settings.admin_group:
        return False
    try:
        group = grp.getgrnam(settings.admin_group)
    except KeyError:
        return False
    return (
        group.gr_gid == os.getegid()
        or group.gr_gid in os.getgroups()
        or user_name(uid) in group.gr_mem
    )


def require_admin(settings: Settings, action: str) -> None:
    """Refuse (exit 1) unless this process may `action` endpoints."""
    if is_admin(settings):
        return
    uid = os.geteuid()
    who = f"{user_name(uid)} (uid {uid})"
    if settings.admin_group:
        needs = f"root or a member of group {settings.admin_group!r}"
        fix = f"run it with sudo, or have an admin add {user_name(uid)} to that group"
    else:
        needs = "root"
        fix = "run it with sudo, or name an admin group (admin_group in epycd.conf)"
    raise Refusal(f"{action} needs {needs}; you are {who}", fix=fix)
