"""``warmcache cache scan|doctor|prune``: inspect and clean compile caches (thin: parse, call, print)."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from warmcache.cache.cleanup import CleanupPlan
from warmcache.cache.doctor import diagnose
from warmcache.cache.inventory import CacheInfo, scan_cache
from warmcache.cache.locate import FLAVORS, locate_caches
from warmcache.cache.neuron import DEFAULT_GRACE_SECONDS
from warmcache.cache.prune import PruneRules, plan_prune
from warmcache.cli._common import (
    cache_dir_option,
    db_option,
    format_table,
    json_option,
    manifest_option,
    open_registry,
    print_json,
)
from warmcache.manifest import Manifest, load_manifest
from warmcache.registry import Registry
from warmcache.settings import CacheFolder
from warmcache.store import StoreLocation, open_store
from warmcache.store.neuron_remote import RemoteCacheInfo, scan_remote_neuron
from warmcache.targets.neuron import CACHE_URL_ENV, remote_cache_url
from warmcache.units import format_age, format_size, parse_age, parse_size

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Which caches a ``cache`` command looks at, and the registry that describes them (``--cache-dir``,
    ``--flavor``, ``--manifest``, ``--db``), with ``--json``."""

    cache_dir: CacheFolder | None
    flavor: str | None
    manifest: Manifest | None
    db_url: str | None
    as_json: bool

    @contextmanager
    def scanned(self, deleting: str | None = None) -> Iterator[tuple[Registry, list[CacheInfo]]]:
        """The registry and each cache folder scanned, its entries looked up in it.

        The registry must exist (scan, doctor and prune never create one): judged against a new,
        empty registry every entry would be an orphan, and ``prune --orphans`` would delete them all.
        A command about to delete (``deleting`` names it) needs that registry named, not found
        (:func:`~warmcache.cli._common.registry_location`); the others only read it.
        """
        with open_registry(
            self.db_url, self.manifest, create=False, writes=deleting is not None, named_for=deleting
        ) as registry:
            records = registry.rows(with_artifacts=True)
            locations = locate_caches(self.cache_dir, self.manifest, self.flavor)
            yield registry, [scan_cache(location, records) for location in locations]

    def scan(self) -> list[CacheInfo]:
        """Each cache folder scanned (the registry read, then closed)."""
        with self.scanned() as (_, infos):
            return infos

    def remote_neuron(self) -> RemoteCacheInfo | None:
        """The compiler's s3:// cache (``NEURON_COMPILE_CACHE_URL``), when no folder was named instead."""
        url = remote_cache_url()
        if url is None or self.cache_dir is not None or self.manifest is not None:
            return None
        return scan_remote_neuron(open_store(StoreLocation.parse(url, f"${CACHE_URL_ENV}")))


def cache_options(func: Callable[..., None]) -> Callable[..., None]:
    """Where the cache is (and the registry that describes it), handed to scan, doctor and prune as one
    :class:`CacheScope` (``scope``)."""

    @functools.wraps(func)
    def command(
        *args: Any,
        cache_dir: CacheFolder | None,
        flavor: str | None,
        manifest_path: str | None,
        db_url: str | None,
        as_json: bool,
        **kwargs: Any,
    ) -> None:
        manifest = load_manifest(manifest_path) if manifest_path else None
        func(*args, scope=CacheScope(cache_dir, flavor, manifest, db_url, as_json), **kwargs)

    options: Callable[..., None] = command
    for option in reversed(
        (
            cache_dir_option(
                "Cache folder (default: $WARMCACHE_CACHE_DIR, the manifest's [cache] dir, then each "
                "compiler's default)."
            ),
            click.option(
                "--flavor",
                type=click.Choice(FLAVORS),
                default=None,
                help="Cache layout (default: detected from the folder).",
            ),
            manifest_option("Take the cache folder and registry from this manifest."),
            db_option,
            json_option,
        )
    ):
        options = option(options)
    return options


def _grace_option(func: F) -> F:
    return click.option(
        "--grace",
        metavar="AGE",
        default=f"{int(DEFAULT_GRACE_SECONDS // 60)}m",
        show_default=True,
        help="Unheld locks, incomplete entries and new orphans younger than this are left alone "
        "(a compile may still be running).",
    )(func)


def _describe_remote(info: RemoteCacheInfo, *, doctor: bool) -> str:
    size = format_size(sum(e.size_bytes for e in info.entries))
    states = ", ".join(f"{n} {s}" for s, n in sorted(info.states.items())) or "empty"
    lines = [f"{info.url} (neuron, remote, from ${CACHE_URL_ENV}): {len(info.entries)} entries, {size}; {states}"]
    for entry in info.entries:
        if entry.state in ("failed", "locked") or (doctor and entry.state == "incomplete"):
            lock = f" (lock {format_age(max(age for _, age in entry.locks))} old)" if entry.locks else ""
            lines.append(f"  {entry.state}: {entry.path}{lock}")
    if doctor and any(e.state != "done" for e in info.entries):
        lines.append(
            "  note: doctor does not change a remote cache; remove these prefixes with your S3 "
            "tooling once no compiler uses them"
        )
    return "\n".join(lines)


@click.group("cache")
def cache_group() -> None:
    """Inspect, repair and prune compile caches (Neuron NEFF cache, Inductor)."""


@cache_group.command("scan")
@cache_options
@click.option("--entries", "show_entries", is_flag=True, help="List every entry, not just the summary.")
def scan(scope: CacheScope, show_entries: bool) -> None:
    """Inventory the cache: entries by kind and state, sizes, and which compiled shapes use them."""
    remote = scope.remote_neuron()
    infos = scope.scan()
    if scope.as_json:
        print_json([info.as_json() for info in infos] + ([remote.as_json()] if remote else []))
        return
    if remote:
        click.echo(_describe_remote(remote, doctor=False))
    for info in infos:
        click.echo(_describe(info))
        if show_entries and info.entries:
            rows = [
                (e.path, e.kind, e.state, format_size(e.size_bytes), format_age(info.scanned_at - e.last_used),
                 "; ".join(u.describe() for u in e.used_by) or "orphan")
                for e in info.entries
            ]  # fmt: skip
            click.echo(format_table(("entry", "kind", "state", "size", "idle", "used by"), rows))
        for missing in info.missing:
            click.echo(f"  missing: {missing.path} ({missing.kind}), needed by {missing.used_by.describe()}")


def _describe(info: CacheInfo) -> str:
    head = f"{info.root} ({info.location.flavor}, from {info.location.source})"
    if not info.exists:
        return f"{head}: does not exist"
    lines = [f"{head}: {len(info.entries)} entries, {format_size(info.size_on_disk)}"]
    for kind, count in sorted(Counter(e.kind for e in info.entries).items()):
        of_kind = [e for e in info.entries if e.kind == kind]
        states = Counter(e.state for e in of_kind)
        versions = sorted({e.compiler_version for e in of_kind if e.compiler_version})
        detail = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        lines.append(
            f"  {kind}: {count} ({format_size(sum(e.size_bytes for e in of_kind))}; "
            f"{detail}{'; neuronxcc ' + ', '.join(versions) if versions else ''})"
        )
    rows = {u.row_id: u for e in info.entries for u in e.used_by}
    statuses = Counter(u.status for u in rows.values())
    orphans = info.orphans
    counted = (
        f"orphans not counted ({info.orphans_unknown})"
        if info.orphans_unknown
        else f"{len(orphans)} orphans ({format_size(sum(e.size_bytes for e in orphans))})"
    )
    lines.append(
        f"  used by {len(rows)} registry rows "
        f"({', '.join(f'{n} {s}' for s, n in sorted(statuses.items())) or 'none'}); "
        f"{counted}; {len(info.missing)} missing artifacts"
    )
    if info.work_dirs:
        names = ", ".join(w.path for w in info.work_dirs[:3]) + (", ..." if len(info.work_dirs) > 3 else "")
        lines.append(
            f"  {len(info.work_dirs)} leftovers of interrupted work "
            f"({format_size(sum(w.size_bytes for w in info.work_dirs))}: {names}); cache doctor --fix "
            "removes them"
        )
    return "\n".join(lines)


@cache_group.command("doctor")
@cache_options
@_grace_option
@click.option("--fix", is_flag=True, help="Apply the repairs (default: only say what would be done).")
@click.option(
    "--any-host", is_flag=True, help="Also forget rows compiled on other hosts that name none of this cache's entries."
)
def doctor(scope: CacheScope, grace: str, fix: bool, any_host: bool) -> None:
    """Find stale locks, failed and incomplete entries, and rows whose artifacts are gone."""
    grace_seconds = parse_age(grace, option="--grace")
    remote = scope.remote_neuron()
    if remote and not scope.as_json:
        click.echo(_describe_remote(remote, doctor=True))
    with scope.scanned(deleting="cache doctor --fix" if fix else None) as (registry, infos):
        plans = [diagnose(info, grace_seconds, any_host=any_host) for info in infos]
        extra = [{**remote.as_json(), "applied": False}] if remote else []
        _report(plans, registry, apply=fix, as_json=scope.as_json, how_to_apply="--fix", extra=extra)


@cache_group.command("prune")
@cache_options
@_grace_option
@click.option("--orphans", is_flag=True, help="Entries no registry row references.")
@click.option(
    "--stale-toolchains",
    is_flag=True,
    help="Entries only rows of other toolchains reference (their rows are forgotten).",
)
@click.option("--older-than", metavar="AGE", default=None, help="Only entries unused for AGE (e.g. 7d, 12h).")
@click.option(
    "--max-size",
    metavar="SIZE",
    default=None,
    help="Delete least recently used entries until the cache fits SIZE (e.g. 20G).",
)
@click.option(
    "--include-referenced",
    is_flag=True,
    help="Also delete entries current compiled/verified shapes need (those rows are forgotten).",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
def prune(
    scope: CacheScope,
    grace: str,
    orphans: bool,
    stale_toolchains: bool,
    older_than: str | None,
    max_size: str | None,
    include_referenced: bool,
    dry_run: bool,
) -> None:
    """Delete cache entries to free space; never one a compiled shape needs unless told so."""
    rules = PruneRules(
        orphans=orphans,
        stale_toolchains=stale_toolchains,
        older_than_seconds=parse_age(older_than, option="--older-than") if older_than else None,
        max_size_bytes=parse_size(max_size, option="--max-size") if max_size else None,
        include_referenced=include_referenced,
        grace_seconds=parse_age(grace, option="--grace"),
    )
    rules.check()
    with scope.scanned(deleting=None if dry_run else "cache prune") as (registry, infos):
        _report(
            [plan_prune(info, rules) for info in infos],
            registry,
            apply=not dry_run,
            as_json=scope.as_json,
            how_to_apply="without --dry-run",
        )


def _report(
    plans: list[CleanupPlan],
    registry: Registry,
    *,
    apply: bool,
    as_json: bool,
    how_to_apply: str,
    extra: list[dict[str, Any]] | None = None,
) -> None:
    """Print each plan, and execute it when asked (rows forgotten before files are deleted); ``extra`` joins the JSON
    list."""
    results = [plan.execute(registry) if apply else None for plan in plans]
    if as_json:
        print_json(
            [
                {**plan.as_json(), "applied": apply, "result": r.as_json() if r else None}
                for plan, r in zip(plans, results)
            ]
            + (extra or [])
        )
        return
    for plan, result in zip(plans, results):
        click.echo(f"{plan.root} ({plan.flavor}):")
        for removal in plan.removals:
            click.echo(
                f"  {'removed' if apply else 'would remove'} {removal.path} "
                f"({format_size(removal.size_bytes)}): {removal.reason}"
            )
        for forget in plan.forgets:
            click.echo(f"  {'forgot' if apply else 'would forget'} row {forget.description}: {forget.reason}")
        for note in plan.notes:
            click.echo(f"  note: {note}")
        if result is not None:
            for path in result.kept:
                click.echo(f"  kept {path}: a registry row started to use it during this run")
            click.echo(f"  freed {format_size(result.freed_bytes)}, forgot {result.forgotten} rows")
        elif plan.is_empty:
            click.echo("  nothing to do")
        else:
            click.echo(
                f"  would free {format_size(plan.freed_bytes)} and forget {len(plan.forgets)} rows; run "
                f"again {how_to_apply} to apply"
            )
