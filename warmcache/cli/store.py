"""``warmcache push|pull`` and ``warmcache store ls|gc``: compiled caches over object storage (thin: parse, call,
print)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from warmcache.cli._common import (
    byte_progress,
    cache_dir_option,
    format_table,
    json_option,
    manifest_option,
    max_unpack_size_option,
    print_json,
    print_result,
    registry_location,
    trust_option,
)
from warmcache.cli.shipping import Shipment, shipment_arguments, verified_only_option
from warmcache.cli.unsigned import allow_unsigned_option, warn_if_unverified
from warmcache.errors import UsageError
from warmcache.manifest import Manifest, load_manifest
from warmcache.settings import CacheFolder
from warmcache.settings_table import STORE_TIMEOUT
from warmcache.shipping.install import DEFAULT_MAX_UNPACK_BYTES
from warmcache.store import resolve_store, resolve_tag_store
from warmcache.store.blob.maintenance import MIN_SAFE_GRACE_SECONDS
from warmcache.store.deadline import DEFAULT_COMMAND_SECONDS, REQUEST_SECONDS, set_command_timeout
from warmcache.store.interface import DEFAULT_GC_GRACE_SECONDS
from warmcache.store.oci.freshness import (
    DEFAULT_MAX_VALIDITY_S,
    EXPIRES_ENV,
    LONGEST_VALIDITY_S,
    MIN_VERSION_ENV,
    STATE_ENV,
    PushPolicy,
    TagMemory,
    parse_pin,
)
from warmcache.store.oci.promote import promote_image
from warmcache.store.pull import pull_manifest
from warmcache.store_location import ACCEPTED_FORMS, StoreLocation
from warmcache.trust import TRUSTED_KEYS_ENV, SigningKey, TrustedKeys
from warmcache.units import format_size, parse_age, parse_size

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

STORE_HELP = f"Store: {ACCEPTED_FORMS} (default: $WARMCACHE_STORE, then the manifest's [store] url)."
ENDPOINT_HELP = (
    "S3-compatible endpoint (MinIO, R2, ...; default: the manifest's [store] endpoint_url, "
    "then AWS_ENDPOINT_URL_S3/AWS)."
)
STORE_TIMEOUT_ENV = STORE_TIMEOUT.env
NOT_CHECKED = (
    f"index signatures not checked: no trusted keys configured (--trust, ${TRUSTED_KEYS_ENV} "
    "or the manifest's [trust] keys)"
)


def sign_option(func: F) -> F:
    """Which key signs pushed indexes: shared by push and warmup --push."""
    return click.option(
        "--sign",
        "sign_key",
        metavar="KEY",
        default=None,
        help="Sign every pushed index with this private key (warmcache keys generate; default: the "
        "manifest's [store] sign_key).",
    )(func)


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


def timeout_option(func: F) -> F:
    """How long a command's network operations may take in all: shared by every command that speaks to a store."""
    return click.option(
        "--timeout",
        metavar="AGE",
        default=None,
        expose_value=False,
        callback=_start_deadline,
        envvar=STORE_TIMEOUT_ENV,
        help=f"Give up on the store after this long in all (e.g. 90s, 30m; default "
        f"{int(DEFAULT_COMMAND_SECONDS // 3600)}h; each request also gets {int(REQUEST_SECONDS)} s plus 1 s per MiB).",
    )(func)


def store_options(func: F) -> F:
    """Which store (and how long its network operations may take): shared by push, pull, store ls|gc|check and warmup
    --push."""
    func = timeout_option(func)
    func = click.option("--endpoint-url", metavar="URL", default=None, help=ENDPOINT_HELP)(func)
    return click.option("--store", "store_url", metavar="URL", default=None, help=STORE_HELP)(func)


def state_dir_option(func: F) -> F:
    """Where this host remembers signed tag versions: shared by push, pull and store promote."""
    return click.option(
        "--state-dir",
        metavar="DIR",
        default=None,
        help=f"Where this host remembers the newest version of each signed oci:// tag it pulled or pushed, refusing "
        f"older ones (default: ${STATE_ENV}, then $XDG_STATE_HOME/warmcache).",
    )(func)


def expires_option(func: F) -> F:
    """How long a signed tag stays valid: shared by push and store promote."""
    return click.option(
        "--expires",
        metavar="AGE",
        default=None,
        help=f"How long a signed oci:// tag stays valid; a pull refuses it after (default: ${EXPIRES_ENV}, then 30d; "
        "at most --max-expires). A push renews it once half is gone.",
    )(func)


def max_expires_option(func: F) -> F:
    """The ceiling on a signed tag's validity: shared by push and store promote."""
    return click.option(
        "--max-expires",
        metavar="AGE",
        default=None,
        help=f"Raise the ceiling on --expires (default {DEFAULT_MAX_VALIDITY_S // 86400}d, at most "
        f"{LONGEST_VALIDITY_S // 86400}d): a tag valid for longer is refused.",
    )(func)


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
        result = store.push(shipment.scope, registry, verified_only=verified_only, signing_key=key, progress=progress)
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
) -> int:
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
    if as_json:
        print_json(result.as_json())
    else:
        rows = result.rows
        click.echo(
            f"{result.cache_dir}: {result.pulled} shapes pulled from {result.store}, "
            f"{result.already_present} already present; "
            f"{result.entries_added} entries installed, {result.entries_present} already there; "
            f"{format_size(result.bytes_downloaded)} downloaded, {format_size(result.bytes_reused)} "
            "reused from an interrupted pull"
            + (f"; rows: {rows.inserted} added, {rows.updated} updated, {rows.unchanged} unchanged" if rows else "")
        )
        click.echo(f"index signatures verified ({trusted.source})" if result.signatures_checked else NOT_CHECKED)
        for line in result.missing:
            click.echo(f"  not in the store: {line}")
    return result.exit_code


@click.group("store")
def store_group() -> None:
    """What an artifact store holds; remove blobs no index references; promote a signed tag to another name."""


_manifest_option = manifest_option("Take the store from this manifest's [store] table.")


def _manifest(path: str | None) -> Manifest | None:
    return load_manifest(path) if path else None


@store_group.command("ls")
@store_options
@_manifest_option
@json_option
def ls(store_url: str | None, endpoint_url: str | None, manifest_path: str | None, as_json: bool) -> None:
    """Compiled shapes per model and toolchain, and the blobs' count and size."""
    listing = resolve_store(store_url, endpoint_url, _manifest(manifest_path)).list()
    if as_json:
        print_json(listing.as_json())
        return
    tagged = any(g.tag for g in listing.groups)  # an oci:// repository: one group per tag
    rows: list[tuple[object, ...]] = [
        ((g.tag,) if tagged else ())
        + (
            g.model,
            g.toolchain_hash[:16],
            g.shapes,
            dt.datetime.fromtimestamp(g.newest, dt.UTC).strftime("%Y-%m-%d %H:%M"),
        )
        for g in listing.groups
    ]
    headers = (("tag",) if tagged else ()) + ("model", "toolchain", "shapes", "newest (UTC)")
    click.echo(format_table(headers, rows) if rows else f"{listing.url}: no shapes")
    click.echo(f"{listing.url}: {listing.blobs} blobs, {format_size(listing.blob_bytes)}")


@store_group.command("gc")
@store_options
@_manifest_option
@click.option(
    "--grace",
    metavar="AGE",
    default=f"{int(DEFAULT_GC_GRACE_SECONDS // 3600)}h",
    show_default=True,
    help="Unreferenced blobs younger than this are kept (a push may still be writing its indexes).",
)
@click.option("--apply", is_flag=True, help="Delete (default: only say what would be deleted).")
@json_option
def gc(
    store_url: str | None, endpoint_url: str | None, manifest_path: str | None, grace: str, apply: bool, as_json: bool
) -> None:
    """Delete blobs no index references; a dry run unless --apply."""
    store = resolve_store(store_url, endpoint_url, _manifest(manifest_path))
    grace_seconds = parse_age(grace, option="--grace")
    if apply and grace_seconds < MIN_SAFE_GRACE_SECONDS:
        click.echo(
            f"warmcache: warning: --grace {grace} is under {int(MIN_SAFE_GRACE_SECONDS // 60)}m: a "
            "push running now may lose blobs its indexes name",
            err=True,
        )
    plan = store.plan_gc(grace_seconds)
    deleted = store.execute_gc(plan) if apply else None
    if as_json:
        print_json({**plan.as_json(), "applied": apply, "deleted": deleted})
        return
    for item in plan.removals:
        click.echo(f"  {'deleted' if apply else 'would delete'} {item.key} ({format_size(item.size)})")
    summary = (
        f"{plan.url}: {plan.indexes} indexes reference {plan.referenced} blobs; "
        f"{len(plan.removals)} unreferenced ({format_size(plan.freed_bytes)})"
    )
    if plan.kept_young:
        summary += f", {plan.kept_young} younger than {grace} kept"
    click.echo(summary + ("" if apply or not plan.removals else "; run again with --apply to delete"))


@store_group.command("check")
@store_options
@_manifest_option
@trust_option
@click.option(
    "--repair", is_flag=True, help="Upload again each damaged or missing blob that the local cache (--cache-dir) holds."
)
@cache_dir_option(
    "The cache a repair takes blobs from (default: $WARMCACHE_CACHE_DIR, then the manifest's [cache] dir)."
)
@json_option
def check(
    store_url: str | None,
    endpoint_url: str | None,
    manifest_path: str | None,
    trust: tuple[str, ...],
    repair: bool,
    cache_dir: CacheFolder | None,
    as_json: bool,
) -> int:
    """Scrub the store: every blob against its sha256 name, every index against its blobs (and signature, with
    --trust); exit 5 while anything is wrong."""
    parsed = _manifest(manifest_path)
    trusted = TrustedKeys.resolve(trust, parsed.trusted_keys if parsed else None)
    store = resolve_store(store_url, endpoint_url, parsed)
    with byte_progress("checking") as progress:
        report, named = store.check(trusted, progress)
    if repair and report.problems:
        report = store.repair(report, named, repair_root(cache_dir, parsed))
    if as_json:
        print_json(report.as_json())
    else:
        for key in report.repaired:
            click.echo(f"  repaired {key}")
        for problem in report.problems:
            click.echo(f"  {problem.problem}: {problem.key}: {problem.detail}")
        state = (
            "ok"
            if not report.problems
            else f"{len(report.problems)} problems"
            + ("" if repair else "; run again with --repair --cache-dir DIR on a host that has the entries")
        )
        click.echo(f"{report.url}: {report.indexes} indexes, {report.blobs} blobs checked; {state}")
    return report.exit_code


def repair_root(cache_dir: CacheFolder | None, manifest: Manifest | None) -> Path:
    """``--cache-dir``, ``$WARMCACHE_CACHE_DIR`` (resolved by the option), then the manifest's ``[cache] dir``: where
    a repair finds the blobs' bytes."""
    if cache_dir is not None:
        return cache_dir.path
    if manifest is not None and manifest.cache_dir is not None:
        return manifest.cache_dir
    raise UsageError("store check --repair: name the cache that holds the entries (--cache-dir DIR)")


@store_group.command("promote")
@click.argument("source", metavar="SRC")
@click.argument("target", metavar="DST")
@click.option("--sign", "sign_key", metavar="KEY", required=True, help="The private key that signs the tag for DST.")
@trust_option
@expires_option
@max_expires_option
@state_dir_option
@timeout_option
@json_option
def promote(
    source: str,
    target: str,
    sign_key: str,
    trust: tuple[str, ...],
    expires: str | None,
    max_expires: str | None,
    state_dir: str | None,
    as_json: bool,
) -> None:
    """Copy the signed oci:// tag SRC to DST (another repository or registry), verified first and signed for DST at a
    version above DST's; a plain copy is refused at pull, since the tag is signed for its own name."""
    key = SigningKey.load(sign_key)
    trusted = TrustedKeys.resolve(trust)
    memory = TagMemory.resolve(state_dir)
    from_store, to_store = (
        resolve_tag_store(StoreLocation.parse(url, name), memory) for name, url in (("SRC", source), ("DST", target))
    )
    to_store.use_push_policy(PushPolicy(expires, max_expires, trusted))
    with byte_progress("promoting") as progress:
        result = promote_image(from_store, to_store, key, trusted, progress)
    print_result(result, as_json, result.message)
