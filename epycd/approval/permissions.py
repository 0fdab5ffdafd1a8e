"""Who may change what runs: root, or members of the admin group. Reading status and plans is
open to everyone.

The admin group widens who may approve, so for anyone but root it comes only from
configuration root controls: `admin_group` in epycd.conf, when that file and its folder
belong to root and nobody else may write them. EPYCD_ADMIN_GROUP, or an EPYCD_CONFIG_DIR
pointing at a folder the caller owns, never widens it.
"""

from __future__ import annotations

import grp
import os

from epycd.approval.record import user_name
from epycd.errors import Refusal
from epycd.settings import Settings, trusted_admin_group


def admin_group(settings: Settings) -> str | None:
    """The group whose members may act besides root, for this caller."""
    if os.geteuid() == 0:
        return settings.admin_group
    return trusted_admin_group(settings.daemon_conf)


def is_member(group_name: str) -> bool:
    try:
        group = grp.getgrnam(group_name)
    except KeyError:
        return False
    return (
        group.gr_gid == os.getegid()
        or group.gr_gid in os.getgroups()
        or user_name(os.geteuid()) in group.gr_mem
    )


def is_admin(settings: Settings) -> bool:
    if os.geteuid() == 0:
        return True
    group = admin_group(settings)
    return group is not None and is_member(group)


def require_admin(settings: Settings, action: str) -> None:
    """Refuse (exit 1) unless this process may `action` endpoints."""
    if is_admin(settings):
        return
    uid = os.geteuid()
    who = f"{user_name(uid)} (uid {uid})"
    group = admin_group(settings)
    if group:
        needs = f"root or a member of group {group!r}"
        fix = f"run it with sudo, or have an admin add {user_name(uid)} to that group"
    else:
        needs = "root"
        fix = (
            "run it with sudo, or have root name an admin group (admin_group in "
            f"{settings.daemon_conf}, owned by root, writable by root only)"
        )
    ignored = ""
    if settings.admin_group and settings.admin_group != group:
        ignored = (
            f"; admin_group {settings.admin_group!r} from EPYCD_ADMIN_GROUP or a file root "
            "does not control is ignored"
        )
    raise Refusal(f"{action} needs {needs}; you are {who}{ignored}", fix=fix)
