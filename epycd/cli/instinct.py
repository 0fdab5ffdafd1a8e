"""`epycctl instinct-recipes --from FILE`: refresh the vendored Instinct recipe data offline."""

from __future__ import annotations

from pathlib import Path

import click

from epycd.cli.options import NonEmptyPath
from epycd.cli.output import json_option, print_json
from epycd.text import escaped


@click.command(name="instinct-recipes")
@click.option(
    "--from",
    "source",
    required=True,
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    help="The recipe's recipes_cache.json (synced elsewhere; read here offline).",
)
@click.option(
    "--out",
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write (default: the shipped data/instinct-recipes.json).",
)
@json_option("Print the report as JSON.")
def instinct_recipes(source: Path, out: Path | None, as_json: bool) -> None:
    """Refresh the Instinct recipes (data/instinct-recipes.json) from a recipes_cache.json.

    Flags the plan owns are dropped and listed. Endpoints planned before keep their
    approval until re-planned: the data is part of an Instinct plan's fingerprint."""
    from epycd.atomic import write_atomic
    from epycd.errors import InputError
    from epycd.model.instinct import RECIPES_FILE, data_path, shipped_recipes
    from epycd.model.instinct_refresh import RefreshReport, convert, serialized
    from epycd.readfile import TABLE_MAX_BYTES, read_bytes

    try:
        raw = read_bytes(source, TABLE_MAX_BYTES)
    except OSError as exc:
        raise InputError(
            f"unreadable: {exc.strerror}", file=source, fix="give a readable recipes_cache.json"
        ) from None
    refreshed, dropped = convert(source, raw, shipped_recipes())
    target = out or data_path(RECIPES_FILE)
    write_atomic(target, serialized(refreshed))
    report = RefreshReport(
        source=str(source),
        written=str(target),
        fetched_at=refreshed.fetched_at,
        docker_image=refreshed.docker_image,
        models=len(refreshed.models),
        dropped=dropped,
    )
    if as_json:
        print_json(report.model_dump())
        return
    click.echo(
        escaped(
            f"wrote {target}: {report.models} model(s), fetched_at {report.fetched_at}, "
            f"image {report.docker_image}"
        )
    )
    for item in dropped:
        click.echo(escaped(f"dropped (the plan decides it): {item}"))
