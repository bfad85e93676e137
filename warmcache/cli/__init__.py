"""The ``warmcache`` command line: a click group of thin commands over the library.

The group is the one exit-code boundary, as pip's ``base_command`` is. A command returns
its :class:`~warmcache.errors.ExitCode` (``None`` is 0); every
:class:`~warmcache.errors.WarmcacheError` becomes ``warmcache: error: ...`` on stderr
(one line per problem) and its exit code; Ctrl-C one line saying what was left, exit
130; any other exception, a bug, one line naming ``--debug``, exit 70. No traceback
reaches users unless they ask for it: ``warmcache --debug`` (or ``WARMCACHE_DEBUG=1``)
prints each decision warmcache logs and the traceback behind the error
(:mod:`warmcache.diagnostics`).
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
from warmcache.cli.interrupted import interrupted_line
from warmcache.cli.keys import keys_group
from warmcache.cli.query import check, explain, plan, shapes
from warmcache.cli.serve import serve
from warmcache.cli.status import status
from warmcache.cli.store import store_group
from warmcache.cli.transfer import pull, push
from warmcache.cli.warmup import verify, warmup
from warmcache.diagnostics import DEBUG_ENV, configure, debug_requested, log_exception
from warmcache.errors import ExitCode, RegistryError, WarmcacheError, first_line
from warmcache.identity.fingerprint import package_version

log = logging.getLogger(__name__)


class _Group(click.Group):
    """The one exit-code boundary: a command's returned code, or what ended it, as one line and its exit code."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:  # --debug's callback reads $WARMCACHE_DEBUG, which may hold neither true nor false
            return super().make_context(info_name, args, parent, **extra)
        except WarmcacheError as exc:
            _report(exc)
            raise click.exceptions.Exit(exc.exit_code) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            code = super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # click's own: --help, a usage error, an exit a command asked for
        except WarmcacheError as exc:
            log_exception(log)
            _report(exc)
            ctx.exit(exc.exit_code)
        except DBAPIError as exc:
            log_exception(log)
            error = RegistryError(f"registry: {first_line(exc.orig or exc)}")
            _report(error)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:
            log_exception(log)
            click.echo(interrupted_line(ctx), err=True)
            ctx.exit(ExitCode.INTERRUPTED)
        except Exception as exc:  # noqa: BLE001 - the boundary: a bug is one line, its traceback behind --debug
            log_exception(log)
            click.echo(
                f"warmcache: error: unexpected {type(exc).__name__}: {first_line(exc)} (a bug in warmcache; "
                "run again with --debug for the traceback)",
                err=True,
            )
            ctx.exit(ExitCode.UNEXPECTED)
        if isinstance(code, int) and not isinstance(code, bool) and code:  # a command returns its ExitCode; None is 0
            ctx.exit(code)
        return code


def _report(exc: WarmcacheError) -> None:
    for line in str(exc).splitlines():
        click.echo(f"warmcache: error: {line}", err=True)


def _debug(_context: click.Context, _parameter: click.Parameter, value: bool) -> None:
    """``--debug``, else ``$WARMCACHE_DEBUG`` read as every true/false variable is (one that is neither is refused)."""
    configure(debug=value)  # first: a previous command in this process (a test's) may have left the log at DEBUG
    if value or debug_requested():
        configure(debug=True)
        os.environ[DEBUG_ENV] = "1"  # the processes this command starts log their decisions too


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version("warmcache") or "unknown", prog_name="warmcache")
@click.option(
    "--debug",
    is_flag=True,
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
