"""``warmcache push|pull``: compiled caches to and from an artifact store (thin: parse, call, print)."""

from __future__ import annotations

import click

from warmcache.cli._common import (
    byte_progress,
    json_option,
    max_unpack_size_option,
    print_result,
    registry_location,
    trust_option,
)
from warmcache.cli.shipping import Shipment, shipment_arguments, verified_only_option
from warmcache.cli.store_options import (
    expires_option,
    max_expires_option,
    sign_option,
    signing_key,
    state_dir_option,
    store_options,
)
from warmcache.cli.unsigned import allow_unsigned_option, warn_if_unverified
from warmcache.errors import ExitCode, UsageError
from warmcache.shipping.install import DEFAULT_MAX_UNPACK_BYTES
from warmcache.shipping.shipment import PushRequest
from warmcache.store import resolve_store
from warmcache.store.oci.freshness import MIN_VERSION_ENV, PushPolicy, TagMemory, parse_pin
from warmcache.store.pull import PullResult, pull_manifest
from warmcache.trust import TRUSTED_KEYS_ENV, TrustedKeys
from warmcache.units import format_size, parse_size

NOT_CHECKED = (
    f"index signatures not checked: no trusted keys configured (--trust, ${TRUSTED_KEYS_ENV} "
    "or the manifest's [trust] keys)"
)


@click.command("push")
@shipment_arguments
@verified_only_option
@sign_option
@expires_option
@max_expires_option
@click.option(
    "--trust",
    "trust",
    metavar="KEY",
    multiple=True,
    help="A public key besides --sign's whose signed oci:// tag this push may build on (a key rotation); repeatable.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Build the oci:// tag from this registry's shapes alone, at a version above the tag's verified one and "
    "this host's memory (when the tag holds an unsigned, foreign or older push: a signed push builds on no other).",
)
@state_dir_option
@store_options
@json_option
def push(
    shipment: Shipment,
    verified_only: bool,
    sign_key: str | None,
    expires: str | None,
    max_expires: str | None,
    trust: tuple[str, ...],
    fresh: bool,
    state_dir: str | None,
    store_url: str | None,
    endpoint_url: str | None,
    as_json: bool,
) -> None:
    """Upload MANIFEST's compiled shapes (what the store lacks) to the store."""
    key = signing_key(sign_key, shipment.manifest)
    store = resolve_store(store_url, endpoint_url, shipment.manifest, TagMemory.resolve(state_dir))
    oci_only = {"--expires": expires, "--max-expires": max_expires, "--trust": trust or None}
    given = [name for name, value in oci_only.items() if value is not None]
    if given and (not store.tagged or key is None):
        raise UsageError(
            f"{given[0]}: only a signed push (--sign) to an oci:// store has an expiry and a base to verify"
        )
    if fresh and not store.tagged:
        raise UsageError("--fresh: only an oci:// tag is built on what it held; this store's pushes add objects")
    if store.tagged:
        store.use_push_policy(PushPolicy(expires, max_expires, TrustedKeys.load(trust, "--trust"), fresh))
    with shipment.opened("pushing", "push --sign" if key else None) as (registry, progress):
        result = store.push(PushRequest(shipment.scope, verified_only, signing_key=key), registry, progress)
    print_result(result, as_json, lambda: result.message(verified_only))


@click.command("pull")
@shipment_arguments
@max_unpack_size_option(
    "Refuse a pull that would write more (default: $WARMCACHE_MAX_UNPACK_SIZE, the "
    f"manifest's [store] max_pull_size, then {format_size(DEFAULT_MAX_UNPACK_BYTES)})."
)
@trust_option
@allow_unsigned_option
@state_dir_option
@click.option(
    "--min-tag-version",
    metavar="N",
    default=None,
    help=f"Refuse a signed oci:// tag older than version N (default: ${MIN_VERSION_ENV}): the floor where no state "
    "dir can be written.",
)
@store_options
@json_option
def pull(
    shipment: Shipment,
    max_size: str | None,
    trust: tuple[str, ...],
    allow_unsigned: bool,
    state_dir: str | None,
    min_tag_version: str | None,
    store_url: str | None,
    endpoint_url: str | None,
    as_json: bool,
) -> ExitCode:
    """Install the cache entries and rows MANIFEST's shapes need from the store; exit 1 naming shapes it lacks."""
    trusted = TrustedKeys.resolve(trust, shipment.manifest.trusted_keys)
    memory = TagMemory.resolve(state_dir, parse_pin(min_tag_version, "--min-tag-version"), "--min-tag-version")
    store = resolve_store(store_url, endpoint_url, shipment.manifest, memory)
    max_bytes = (
        parse_size(max_size, option="--max-size")
        if max_size is not None
        else shipment.manifest.store.max_pull_bytes or DEFAULT_MAX_UNPACK_BYTES
    )
    # checked now; the database is created only once the pull passed its checks
    registry = registry_location(shipment.db_url, shipment.manifest)
    warn_if_unverified(allow_unsigned, trusted)
    with byte_progress("pulling") as progress:
        result = pull_manifest(
            shipment.scope,
            registry,
            store,
            max_bytes=max_bytes,
            trusted=trusted,
            allow_unsigned=allow_unsigned,
            progress=progress,
        )
    print_result(result, as_json, lambda: _pulled(result, trusted))
    return result.exit_code


def _pulled(result: PullResult, trusted: TrustedKeys) -> str:
    """What ``pull`` says it fetched, installed and merged, whether it checked signatures, and what the store lacks."""
    rows = f"; {result.rows.describe()}" if result.rows else ""
    lines = [
        f"{result.cache_dir}: {result.pulled} shapes pulled from {result.store}, {result.already_present} already "
        f"present; {result.entries_added} entries installed, {result.entries_present} already there; "
        f"{format_size(result.bytes_downloaded)} downloaded, {format_size(result.bytes_reused)} reused from an "
        f"interrupted pull{rows}",
        f"index signatures verified ({trusted.source})" if result.signatures_checked else NOT_CHECKED,
    ]
    return "\n".join(lines + [f"  not in the store: {line}" for line in result.missing])
