"""The ``warmcache`` command line: a click group of thin commands over the library.

Every :class:`~warmcache.errors.WarmcacheError` becomes ``warmcache: error: ...``
on stderr (one line per problem) and its exit code; no traceback reaches users.
"""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy.exc import DBAPIError

from warmcache.cli.buckets import buckets_group
from warmcache.cli.bundle import bundle_group
from warmcache.cli.cache import cache_group
from warmcache.cli.db import db_group
from warmcache.cli.guard import guard_group, misses
from warmcache.cli.keys import keys_group
from warmcache.cli.query import check, explain, plan, shapes
from warmcache.cli.serve import serve
from warmcache.cli.status import status
from warmcache.cli.store import pull, push, store_group
from warmcache.cli.warmup import verify, warmup
from warmcache.errors import RegistryError, WarmcacheError, first_line
from warmcache.identity.fingerprint import package_version


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WarmcacheError as exc:
            _fail(ctx, exc)
        except DBAPIError as exc:
            _fail(ctx, RegistryError(f"registry: {first_line(exc.orig or exc)}"))


def _fail(ctx: click.Context, exc: WarmcacheError) -> None:
    for line in str(exc).splitlines():
        click.echo(f"warmcache: error: {line}", err=True)
    ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version("warmcache") or "unknown", prog_name="warmcache")
def main() -> None:
    """Pre-warm compile caches, record what is compiled, and guard production against recompiles."""


for _command in (
    plan,
    explain,
    shapes,
    check,
    status,
    db_group,
    buckets_group,
    warmup,
    verify,
    misses,
    guard_group,
    cache_group,
    bundle_group,
    keys_group,
    serve,
    push,
    pull,
    store_group,
):
    main.add_command(_command)
