"""``warmcache store ls|gc|check|promote``: what an artifact store holds, and keeping it sound (thin: parse, call,
print)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from warmcache.cli._common import (
    byte_progress,
    cache_dir_option,
    format_table,
    json_option,
    manifest_option,
    print_json,
    print_result,
    trust_option,
)
from warmcache.cli.store_options import (
    expires_option,
    max_expires_option,
    state_dir_option,
    store_options,
    timeout_option,
)
from warmcache.errors import ExitCode, UsageError
from warmcache.manifest import Manifest, load_manifest
from warmcache.settings import CacheFolder
from warmcache.store import resolve_store, resolve_tag_store
from warmcache.store.blob.maintenance import MIN_SAFE_GRACE_SECONDS
from warmcache.store.interface import DEFAULT_GC_GRACE_SECONDS
from warmcache.store.oci.freshness import PushPolicy, TagMemory
from warmcache.store.oci.promote import promote_image
from warmcache.store_location import StoreLocation
from warmcache.trust import SigningKey, TrustedKeys
from warmcache.units import format_size, parse_age


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
) -> ExitCode:
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
