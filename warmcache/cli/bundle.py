"""``warmcache bundle pack|unpack``: ship a warm cache and its registry rows (thin: parse, call, print)."""

from __future__ import annotations

from pathlib import Path

import click

from warmcache.cli._common import (
    byte_progress,
    cache_dir_option,
    db_option,
    json_option,
    manifest_option,
    max_unpack_size_option,
    print_result,
    registry_location,
    sign_option,
    trust_option,
)
from warmcache.cli.shipping import Shipment, shipment_arguments, verified_only_option
from warmcache.cli.unsigned import allow_unsigned_option, warn_if_unverified
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.settings import CacheFolder
from warmcache.shipping.bundle import pack_bundle
from warmcache.shipping.install import DEFAULT_MAX_UNPACK_BYTES
from warmcache.shipping.unbundle import unpack_bundle
from warmcache.trust import SigningKey, TrustedKeys
from warmcache.units import format_size, parse_size


@click.group("bundle")
def bundle_group() -> None:
    """Pack a manifest's compiled cache entries and rows into one file; unpack it elsewhere."""


@bundle_group.command("pack")
@shipment_arguments
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Bundle file (*.tar, *.tar.gz, *.tgz, *.tar.xz).",
)
@verified_only_option
@sign_option("Sign the bundle with this private key (warmcache keys generate).")
@json_option
def pack(shipment: Shipment, output: Path, verified_only: bool, signing_key: SigningKey | None, as_json: bool) -> None:
    """Pack the cache entries MANIFEST's compiled shapes need, their rows and sha256 sums."""
    with shipment.opened("packing", "bundle pack --sign" if signing_key else None) as (registry, progress):
        result = pack_bundle(
            shipment.scope, registry, output, verified_only=verified_only, signing_key=signing_key, progress=progress
        )
    print_result(result, as_json, lambda: result.message(verified_only))


@bundle_group.command("unpack")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@cache_dir_option("Cache folder to fill (default: $WARMCACHE_CACHE_DIR, then the compiler's default).")
@click.option(
    "--force",
    is_flag=True,
    help="Unpack even if the bundle was built with another toolchain (its rows then read stale).",
)
@trust_option
@allow_unsigned_option
@manifest_option("Read [trust] keys and [registry] url from this manifest.", dest="manifest")
@max_unpack_size_option(
    "Refuse a bundle whose files total more than SIZE (default "
    f"{format_size(DEFAULT_MAX_UNPACK_BYTES)}; env WARMCACHE_MAX_UNPACK_SIZE)."
)
@db_option
@json_option
def unpack(
    bundle: Path,
    cache_dir: CacheFolder | None,
    force: bool,
    trust: tuple[str, ...],
    allow_unsigned: bool,
    manifest: str | None,
    max_size: str | None,
    db_url: str | None,
    as_json: bool,
) -> None:
    """Check every file of BUNDLE, install its cache entries and merge its registry rows."""
    parsed = load_manifest(manifest) if manifest else None
    trusted = TrustedKeys.resolve(trust, parsed.trusted_keys if parsed else TrustedKeys())
    location = registry_location(db_url, parsed)  # checked now; the database is opened only once the bundle passed
    max_bytes = parse_size(max_size, option="--max-size") if max_size is not None else DEFAULT_MAX_UNPACK_BYTES
    if bundle.is_file():
        warn_if_unverified(allow_unsigned, trusted)
    with byte_progress("unpacking") as progress:
        result = unpack_bundle(
            bundle,
            lambda: Registry.open(location),
            cache_dir=cache_dir,
            force=force,
            trusted=trusted,
            allow_unsigned=allow_unsigned,
            max_bytes=max_bytes,
            progress=progress,
        )
    print_result(result, as_json, result.message)
