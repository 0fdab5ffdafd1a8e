"""What the model benchmarks (serving.py, memory.py) share at their edges: the command line
of a run (where it is saved, which models, reprinting a saved run) and the table cells."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MODELS = ["tiny", "small"]
"""The models of tests/tools/tiny_model.py a run serves, in its order."""


def run_parser(doc: str | None, out: Path) -> argparse.ArgumentParser:
    """A run's command line so far: --out (its JSON, rewritten after each model) and --models."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    return parser


def parse_run(
    parser: argparse.ArgumentParser, render: Callable[[dict[str, Any]], str]
) -> argparse.Namespace | None:
    """The arguments, --render last; None once a saved run's tables are printed (--render
    FILE measures nothing)."""
    parser.add_argument("--render", type=Path, help="only print the tables of a saved run")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return None
    return args


def new_report(machine: dict[str, str], settings: dict[str, Any], **parts: Any) -> dict[str, Any]:
    """A run's JSON as it starts: when, on which machine, with which settings, then `parts`
    (what it fills in as it measures)."""
    started = datetime.now(UTC).isoformat(timespec="seconds")
    return {"started": started, "machine": machine, "settings": settings, **parts}


def fmt(value: Any, digits: int = 1) -> str:
    """A figure with `digits` decimals; `-` where the run has none."""
    return "-" if value is None else f"{value:.{digits}f}"
