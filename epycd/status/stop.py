"""The admin's stop marker: `epycctl stop NAME` keeps the endpoint down, even across boots,
until `epycctl start NAME` (the boot-time approval check reads the same file)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from epycd.readfile import STATE_MAX_BYTES, read_bytes
from epycd.settings import Settings

STOPPED = "stopped"
"""The state name; the marker files live where `stop_marker_path` says."""


class StopMarker(BaseModel):
    """`epycctl stop NAME` was run: keep the endpoint down until `epycctl start NAME`."""

    endpoint: str
    by: str
    at: datetime


def stop_marker_path(settings: Settings, name: str) -> Path:
    """The path the boot-time approval check also reads (one definition, there)."""
    from epycd.approval.check import stop_marker

    return stop_marker(settings, name)


def stop_markers_dir(settings: Settings) -> Path:
    return stop_marker_path(settings, "-").parent


def read_stop_marker(settings: Settings, name: str) -> StopMarker | None:
    path = stop_marker_path(settings, name)
    try:
        return StopMarker.model_validate_json(read_bytes(path, STATE_MAX_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return StopMarker(
            endpoint=name, by=f"unknown (unreadable marker {path})", at=datetime.now(UTC)
        )
