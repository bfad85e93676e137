"""``warmcache bundle pack|unpack``: ship a warm cache and its registry rows (thin: parse, call, print)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import click

from warmcache.cache.bundle import pack_bundle
from warmcache.cache.locate import locate_caches
from warmcache.cache.unbundle import unpack_bundle
from warmcache.cache.units import format_size
from warmcache.cli._common import db_option, is_terminal, json_option, open_registry, print_json
from warmcache.cli.progress import amount_progress
from warmcache.errors import UsageError
from warmcache.manifest import load_manifest


@click.group("bundle")
def bundle_group() -> None:
    """Pack a manifest's compiled cache entries and rows into one file; unpack it elsewhere."""


@bundle_group.command("pack")
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Bundle file (*.tar, *.tar.gz, *.tgz, *.tar.xz).")
@click.option("--model", "model_name", default=None, help="Only this model's shapes.")
@click.option("--verified-only", is_flag=True, help="Only shapes warmcache verify proved (default: compiled and verified).")
@click.option("--cache-dir", metavar="DIR", default=None, help="Cache folder (default: $WARMCACHE_CACHE_DIR, the manifest's [cache] dir, then the compiler's default).")
@db_option
@json_option
def pack(manifest: str, output: Path, model_name: str | None, verified_only: bool, cache_dir: str | None, db_url: str | None, as_json: bool) -> None:
    """Pack the cache entries MANIFEST's compiled shapes need, their rows and sha256 sums."""
    parsed = load_manifest(manifest)
    scope = dataclasses.replace(parsed, models=(parsed.model(model_name),)) if model_name else parsed
    locations = locate_caches(cache_dir, scope)
    if len(locations) != 1:
        roots = ", ".join(f"{loc.root} ({loc.flavor})" for loc in locations) or "none"
        raise UsageError(f"{manifest}: its models use {len(locations)} cache folders ({roots}); pack one at a time with --model or --cache-dir")
    with open_registry(db_url, parsed) as registry, _progress("packing") as progress:
        result = pack_bundle(parsed, registry, locations[0], output, model_name=model_name, verified_only=verified_only, progress=progress)
    if as_json:
        print_json(result.as_json())
        return
    click.echo(
        f"{result.output}: {result.rows} compiled shapes, {result.entries} cache entries, {result.files} files ({format_size(result.bytes)})"
        + (f"; {result.not_compiled} declared shapes are not in the bundle (not {'verified' if verified_only else 'compiled'})" if result.not_compiled else "")
    )


@bundle_group.command("unpack")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cache-dir", metavar="DIR", default=None, help="Cache folder to fill (default: $WARMCACHE_CACHE_DIR, then the compiler's default).")
@click.option("--force", is_flag=True, help="Unpack even if the bundle was built with another toolchain (its rows then read stale).")
@db_option
@json_option
def unpack(bundle: Path, cache_dir: str | None, force: bool, db_url: str | None, as_json: bool) -> None:
    """Check every file of BUNDLE, install its cache entries and merge its registry rows."""
    with open_registry(db_url) as registry, _progress("unpacking") as progress:
        result = unpack_bundle(bundle, registry, cache_dir=cache_dir, force=force, progress=progress)
    if as_json:
        print_json(result.as_json())
        return
    rows = result.rows
    click.echo(
        f"{result.root}: {result.added} entries added, {result.replaced} replaced, {result.already_present} already present "
        f"({result.files} files, {format_size(result.bytes)} checked); rows: {rows.inserted} added, {rows.updated} updated, {rows.unchanged} unchanged"
    )
    for line in rows.skipped:
        click.echo(f"  skipped row {line}")


def _progress(label: str) -> AbstractContextManager[Callable[[int, int], None]]:
    """A byte progress bar on a terminal; on CI a plain line at every quarter."""
    return amount_progress(label, terminal=is_terminal(), steps=4, unit="B", line=lambda done, total: f"{label}: {format_size(done)} of {format_size(total)}")
