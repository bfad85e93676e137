"""The options every command that speaks to a store shares: which store, how long it may take, signing, a signed
tag's expiry and where this host remembers tag versions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import click

from warmcache.manifest import Manifest
from warmcache.settings_table import STORE_TIMEOUT
from warmcache.store.deadline import DEFAULT_COMMAND_SECONDS, REQUEST_SECONDS, set_command_timeout
from warmcache.store.oci.freshness import DEFAULT_MAX_VALIDITY_S, EXPIRES_ENV, LONGEST_VALIDITY_S, STATE_ENV
from warmcache.store_location import ACCEPTED_FORMS
from warmcache.trust import SigningKey
from warmcache.units import parse_age

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

STORE_HELP = f"Store: {ACCEPTED_FORMS} (default: $WARMCACHE_STORE, then the manifest's [store] url)."
ENDPOINT_HELP = (
    "S3-compatible endpoint (MinIO, R2, ...; default: the manifest's [store] endpoint_url, "
    "then AWS_ENDPOINT_URL_S3/AWS)."
)
STORE_TIMEOUT_ENV = STORE_TIMEOUT.env


#: Which key signs pushed indexes: shared by push and warmup --push.
sign_option = click.option(
    "--sign",
    "sign_key",
    metavar="KEY",
    default=None,
    help="Sign every pushed index with this private key (warmcache keys generate; default: the "
    "manifest's [store] sign_key).",
)


def signing_key(flag: str | None, manifest: Manifest) -> SigningKey | None:
    """``--sign``, else the manifest's ``[store] sign_key``, else no signing."""
    path = flag or manifest.store.sign_key
    return SigningKey.load(path) if path else None


def _start_deadline(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--timeout``'s callback; a value from ``$WARMCACHE_STORE_TIMEOUT`` is named as such in every message about
    it."""
    from_env = param.name is not None and ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT
    source = f"${STORE_TIMEOUT_ENV}" if from_env else "--timeout"
    log.debug("%s: from %s", STORE_TIMEOUT.name, source if value is not None else "default")
    set_command_timeout(parse_age(value, option=source) if value is not None else DEFAULT_COMMAND_SECONDS, source)


#: How long a command's network operations may take in all: shared by every command that speaks to a store.
timeout_option = click.option(
    "--timeout",
    metavar="AGE",
    default=None,
    expose_value=False,
    callback=_start_deadline,
    envvar=STORE_TIMEOUT_ENV,
    help=f"Give up on the store after this long in all (e.g. 90s, 30m; default "
    f"{int(DEFAULT_COMMAND_SECONDS // 3600)}h; each request also gets {int(REQUEST_SECONDS)} s plus 1 s per MiB).",
)


def store_options(func: F) -> F:
    """Which store (and how long its network operations may take): shared by push, pull, store ls|gc|check and warmup
    --push."""
    func = timeout_option(func)
    func = click.option("--endpoint-url", metavar="URL", default=None, help=ENDPOINT_HELP)(func)
    return click.option("--store", "store_url", metavar="URL", default=None, help=STORE_HELP)(func)


#: Where this host remembers signed tag versions: shared by push, pull and store promote.
state_dir_option = click.option(
    "--state-dir",
    metavar="DIR",
    default=None,
    help=f"Where this host remembers the newest version of each signed oci:// tag it pulled or pushed, refusing "
    f"older ones (default: ${STATE_ENV}, then $XDG_STATE_HOME/warmcache).",
)


#: How long a signed tag stays valid: shared by push and store promote.
expires_option = click.option(
    "--expires",
    metavar="AGE",
    default=None,
    help=f"How long a signed oci:// tag stays valid; a pull refuses it after (default: ${EXPIRES_ENV}, then 30d; "
    "at most --max-expires). A push renews it once half is gone.",
)


#: The ceiling on a signed tag's validity: shared by push and store promote.
max_expires_option = click.option(
    "--max-expires",
    metavar="AGE",
    default=None,
    help=f"Raise the ceiling on --expires (default {DEFAULT_MAX_VALIDITY_S // 86400}d, at most "
    f"{LONGEST_VALIDITY_S // 86400}d): a tag valid for longer is refused.",
)
