"""``warmcache db``: schema revisions of the registry database."""

from __future__ import annotations

import click

from warmcache.cli._common import db_option, json_option, print_json, registry_location
from warmcache.registry import Registry, schema


@click.group("db")
def db_group() -> None:
    """Create or upgrade the registry's schema (Alembic migrations)."""


@db_group.command("upgrade")
@db_option
@click.option("--revision", default="head", show_default=True, help="Target schema revision.")
def upgrade(db_url: str | None, revision: str) -> None:
    """Bring the registry database to the newest schema revision."""
    location = registry_location(db_url)
    with Registry.open(
        location, check_schema=False
    ) as registry:  # a PostgreSQL search_path naming no schema is refused here
        before, after = schema.upgrade(registry.engine, revision, display_url=registry.location.display)
    click.echo(
        f"{location.display}: schema {before or 'empty'} -> {after}"
        if before != after
        else f"{location.display}: schema {after} (already current)"
    )


@db_group.command("current")
@db_option
@json_option
def current(db_url: str | None, as_json: bool) -> None:
    """Show the registry's schema revision and whether it is up to date."""
    location = registry_location(db_url)
    with Registry.open(
        location, check_schema=False, read_only=True
    ) as registry:  # a read: a missing registry is an error, not a new file, and the file is left as it was
        revision = schema.current_revision(registry.engine)
        head = schema.head_revision(registry.engine)
    if as_json:
        print_json({"url": location.display, "revision": revision, "head": head, "up_to_date": revision == head})
        return
    state = "up to date" if revision == head else f"needs upgrade to {head} (warmcache db upgrade)"
    click.echo(f"{location.display}: schema {revision or 'empty'} ({state})")
