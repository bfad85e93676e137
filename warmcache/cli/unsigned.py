"""``--allow-unsigned``: the one way to install a compile cache whose signature nobody checks (said once, loudly)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from warmcache.trust import ALLOW_UNSIGNED_ENV, TrustedKeys, unsigned_allowed_by_environment

F = TypeVar("F", bound=Callable[..., Any])


def allow_unsigned_option(func: F) -> F:
    """Shared by ``pull`` and ``bundle unpack``: without trusted keys they refuse unless given this."""
    return click.option(
        "--allow-unsigned",
        is_flag=True,
        callback=_flag_or_environment,
        help="Install even though no trusted key checks who built it (a compile cache is code; "
        f"default: refuse without --trust). Env: ${ALLOW_UNSIGNED_ENV}=1.",
    )(func)


def _flag_or_environment(_context: click.Context, _parameter: click.Parameter, value: bool) -> bool:
    """The flag, else ``$WARMCACHE_ALLOW_UNSIGNED`` read as every true/false variable is (neither is refused)."""
    return value or unsigned_allowed_by_environment()


def warn_if_unverified(allow_unsigned: bool, trusted: TrustedKeys) -> None:
    """The one loud line an unverified install prints before it starts."""
    if allow_unsigned and not trusted.configured:
        click.echo(
            "warmcache: warning: --allow-unsigned: installing compiled code whose origin nobody "
            "verified (no trusted keys configured)",
            err=True,
        )
