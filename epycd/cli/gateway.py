"""`epycctl gateway`: one URL for every approved endpoint, with a key per client
(docs/gateway.md). `plan` shows what it would route, `approve` puts it in place and
`remove` takes it away; `add-key`, `keys` and `revoke` manage its clients."""

from __future__ import annotations

import click

from epycd.cli.output import json_option, print_json, table
from epycd.errors import InputError
from epycd.gateway.keys import MAX_LIMIT, KeyStore
from epycd.settings import Settings, load_settings


@click.group()
def gateway() -> None:
    """One URL for every approved endpoint: the request's model picks the endpoint, and each
    client has its own key and limits."""


@gateway.command("plan")
@json_option("Print the plan as JSON.")
def plan(as_json: bool) -> None:
    """What the gateway would route now: one route per approved endpoint."""
    from epycd.gateway.plan import plan_gateway

    settings = load_settings()
    planned = plan_gateway(settings)
    if as_json:
        print_json(planned.model_dump(mode="json"))
        return
    where = planned.listen or f"nowhere: set gateway_listen in {settings.daemon_conf}"
    scheme = "https" if planned.tls_cert_file else "http"
    click.echo(f"gateway: {scheme}://{where}" if planned.listen else f"gateway: {where}")
    rows = [(r.model, r.endpoint, r.primary_endpoint, r.address) for r in planned.routes]
    click.echo(table(rows, ("model", "endpoint", "serves", "reached at")) if rows else "no routes")
    for skipped in planned.skipped:
        click.echo(f"left out: {skipped.endpoint}: {skipped.reason}")
    if planned.clients is None:
        click.echo("clients: only root may read the key store")
    else:
        click.echo(
            f"clients: {', '.join(planned.clients) or 'none (epycctl gateway add-key NAME)'}"
        )


@gateway.command("approve")
@click.option("--yes", "-y", is_flag=True, help="Approve without asking (scripts).")
@click.option("--no-start", is_flag=True, help="Install and enable it, start it at the next boot.")
def approve(yes: bool, no_start: bool) -> None:
    """Install the gateway's unit and files: it starts now and at every boot. Its routes and
    keys then follow the approved endpoints and the key store without a new approval."""
    from epycd.approval.install import state_lock
    from epycd.approval.permissions import require_admin
    from epycd.cli.approve import ask
    from epycd.gateway import apply
    from epycd.gateway.unit import UNIT

    settings = load_settings()
    require_admin(settings, "approve the gateway")
    apply.check_listen(settings)
    apply.check_certificate(settings)
    click.echo(apply.unit_text(settings))
    ask(f"Install {UNIT} on {settings.gateway_listen}?", yes=yes)
    with state_lock(settings):
        for step in apply.approve(settings, start=not no_start):
            click.echo(step)


@gateway.command("remove")
@click.option("--yes", "-y", is_flag=True, help="Remove without asking (scripts).")
def remove(yes: bool) -> None:
    """Stop the gateway and delete its unit and approval (its keys stay)."""
    from epycd.approval.install import state_lock
    from epycd.approval.permissions import require_admin
    from epycd.cli.approve import ask
    from epycd.gateway import apply

    settings = load_settings()
    require_admin(settings, "remove the gateway")
    ask("Stop and remove the gateway?", yes=yes)
    with state_lock(settings):
        for step in apply.remove(settings) or ["no gateway was installed"]:
            click.echo(step)


def _store_changed(settings: Settings, store: KeyStore) -> None:
    """Write the key store's new `store` and bring the installed gateway to it, or change
    nothing: every check (the store's names, HAProxy's own check of the gateway with it)
    runs before the store is written. A gateway that could not be updated after that is an
    error, never a success: the store holds the change and HAProxy does not yet."""
    from epycd.errors import EpycError, Refusal
    from epycd.gateway import apply, keys

    update = apply.prepare(settings, store)
    keys.write_store(settings, store)
    if update is None:
        return
    try:
        click.echo(apply.put_in_place(settings, update))
    except (EpycError, OSError) as exc:
        raise Refusal(
            f"the key store is changed, but the gateway was not updated: {exc}",
            fix="run `epycctl gateway approve` to put the gateway in place with it",
        ) from None


def _models(value: str | None) -> list[str] | None:
    if value is None:
        return None
    models = [model.strip() for model in value.split(",") if model.strip()]
    if not models:
        raise InputError("names no model", key="--models", fix="give model names: --models a,b")
    return models


@gateway.command("add-key")
@click.argument("name")
@click.option("--models", help="The models this key may use, comma-separated (default: all).")
@click.option(
    "--rpm",
    type=click.IntRange(min=1, max=MAX_LIMIT),
    help="Requests per minute (default: no limit).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=MAX_LIMIT),
    help="Requests at once (default: no limit).",
)
def add_key(name: str, models: str | None, rpm: int | None, concurrency: int | None) -> None:
    """Make a key for client NAME. The key is printed once, alone on the last line; only its
    SHA-256 is kept."""
    from epycd.approval.install import state_lock
    from epycd.approval.permissions import require_admin
    from epycd.gateway import keys

    settings = load_settings()
    require_admin(settings, "add gateway keys")
    with state_lock(settings):
        store, key = keys.add_key(
            keys.read_store(settings), name, models=_models(models), rpm=rpm,
            concurrency=concurrency,
        )  # fmt: skip
        _store_changed(settings, store)
    click.echo(f"added key {name!r}: shown this once, keep it safe; `epycctl gateway revoke "
               f"{name}` ends it")  # fmt: skip
    click.echo(key)


@gateway.command("keys")
@json_option("Print the keys as JSON.")
def list_keys(as_json: bool) -> None:
    """The clients and their limits (never a key)."""
    from epycd.gateway.keys import read_store

    store = read_store(load_settings())
    fields = {"sha256"}
    if as_json:
        print_json({"keys": [key.model_dump(mode="json", exclude=fields) for key in store.keys]})
        return
    rows = [
        (key.name, ",".join(key.models) if key.models is not None else "all",
         key.rpm or "-", key.concurrency or "-", key.added_at.isoformat(timespec="seconds"))
        for key in store.keys
    ]  # fmt: skip
    header = ("client", "models", "rpm", "concurrency", "added")
    click.echo(table(rows, header) if rows else "no keys (epycctl gateway add-key NAME)")


@gateway.command("revoke")
@click.argument("name")
def revoke(name: str) -> None:
    """End client NAME's key."""
    from epycd.approval.install import state_lock
    from epycd.approval.permissions import require_admin
    from epycd.gateway import keys

    settings = load_settings()
    require_admin(settings, "revoke gateway keys")
    with state_lock(settings):
        _store_changed(settings, keys.revoke_key(keys.read_store(settings), name))
    click.echo(f"revoked key {name!r}")
