"""The ``warmcache`` command line: a click group of thin commands over the library.

Every :class:`~warmcache.errors.WarmcacheError` becomes ``warmcache: error: ...``
on stderr (one line per problem) and its exit code; no traceback reaches users
unless they ask for it: ``warmcache --debug`` (or ``WARMCACHE_DEBUG=1``) prints each
decision warmcache logs and the traceback behind the error (:mod:`warmcache.diagnostics`).
"""

from __future__ import annotations

import logging
import os
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
from warmcache.diagnostics import DEBUG_ENV, configure, log_exception
from warmcache.errors import RegistryError, WarmcacheError, first_line
from warmcache.identity.fingerprint import package_version

log = logging.getLogger(__name__)


class _Group(click.Group):
    """The one exit-code boundary: a warmcache error becomes its one-line message and exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WarmcacheError as exc:
            log_exception(log)
            _fail(ctx, exc)
        except DBAPIError as exc:
            log_exception(log)
            _fail(ctx, RegistryError(f"registry: {first_line(exc.orig or exc)}"))


def _fail(ctx: click.Context, exc: WarmcacheError) -> None:
    for line in str(exc).splitlines():
        click.echo(f"warmcache: error: {line}", err=True)
    ctx.exit(exc.exit_code)


def _debug(_context: click.Context, _parameter: click.Parameter, value: bool) -> None:
    configure(debug=value)
    if value:
        os.environ[DEBUG_ENV] = "1"  # the processes this command starts log their decisions too


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version("warmcache") or "unknown", prog_name="warmcache")
@click.option(
    "--debug",
    is_flag=True,
    envvar="WARMCACHE_DEBUG",
    is_eager=True,
    expose_value=False,
    callback=_debug,
    help="Log every decision (claims, leases, retries, cache hits and misses, skips) to stderr, "
    "and the traceback behind an error. Also $WARMCACHE_DEBUG=1.",
)
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
