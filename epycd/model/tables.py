"""The shipped data tables, one JSON file per version of what they were read from (an
engine's architecture tables, vLLM's footprints): where `data/` is, and the versions a
folder of them holds, oldest first."""

from __future__ import annotations

from pathlib import Path

from epycd.text import is_digits


def data_dir() -> Path:
    """`data/` of a source checkout, or `epycd/data/` inside the installed wheel."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "data", package.parent / "data"):
        if candidate.is_dir():
            return candidate
    return package.parent / "data"


def version_key(version: str) -> tuple[int, ...]:
    """ "0.32.0+cpu" -> (0, 32, 0): versions compared by their numbers."""
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if is_digits(ch))
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def available_versions(folder: Path) -> list[str]:
    """The versions of the tables in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    return sorted((p.stem for p in folder.glob("*.json")), key=version_key)
