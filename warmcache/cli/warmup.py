"""``warmcache warmup`` and ``warmcache verify``: fill the compile cache, then prove it serves."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import click

from warmcache.cli._common import (
    F,
    cache_dir_option,
    count_option,
    db_option,
    is_terminal,
    json_option,
    print_json,
    registry_location,
)
from warmcache.cli.quiet import quiet_libraries, verbose_option
from warmcache.cli.running import PHASE_LINE_SECONDS
from warmcache.cli.store_options import sign_option, signing_key, store_options
from warmcache.errors import ExitCode
from warmcache.manifest import load_manifest
from warmcache.settings import CacheFolder
from warmcache.settings_table import PROGRESS_EVERY
from warmcache.store import resolve_store
from warmcache.store.publish import ShapePublisher

if TYPE_CHECKING:
    from warmcache.warmup.progress import Finished, Progress


class _Summary(Protocol):
    @property
    def exit_code(self) -> int: ...

    def as_json(self) -> dict[str, Any]: ...

    def lines(self) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class RunDisplay:
    """How warmup and verify show a run: progress lines (how often, where), ``--json``, the libraries' chatter."""

    progress_every: float
    as_json: bool
    verbose: bool

    def progress(self, label: str) -> Callable[[int], Progress[Finished]]:
        """The progress display of a run of ``total`` specs, built when the run knows its total."""
        from warmcache.cli.progress import spec_progress

        terminal = is_terminal()
        return lambda total: spec_progress(total, terminal=terminal, label=label, every=self.progress_every)


def run_display_options(func: Callable[..., int]) -> Callable[..., int]:
    """``--progress-every``, ``--json`` and ``--verbose``, handed to the command as one :class:`RunDisplay`
    (``display``), the libraries quieted before the command body imports any of them."""

    @functools.wraps(func)
    def command(*args: Any, progress_every: float, as_json: bool, verbose: bool, **kwargs: Any) -> int:
        quiet_libraries(verbose)
        return func(*args, display=RunDisplay(progress_every, as_json, verbose), **kwargs)

    return progress_every_option(json_option(verbose_option(command)))


def _finish(summary: _Summary, as_json: bool, publisher: ShapePublisher | None = None) -> int:
    """Print a run's summary (text or JSON), and what it pushed; the command's exit code."""
    if as_json:
        print_json({**summary.as_json(), **({"push": publisher.as_json()} if publisher else {})})
    else:
        for line in summary.lines() + (publisher.lines() if publisher else []):
            click.echo(line)
    return summary.exit_code or (publisher.exit_code if publisher else ExitCode.OK)


CACHE_HELP = (
    "Compile cache folder (default: $WARMCACHE_CACHE_DIR, then the manifest's [cache] dir, then the target's own)."
)


def progress_every_option(func: F) -> F:
    """``--progress-every SECONDS``: how often plain output (not a terminal) repeats a running spec's phase."""
    return click.option(
        "--progress-every",
        "progress_every",
        metavar="SECONDS",
        type=click.FloatRange(min=0, min_open=True),
        envvar=PROGRESS_EVERY.env,
        default=PHASE_LINE_SECONDS,
        show_default=True,
        help="In plain output (CI logs), repeat each running spec's phase after this many silent "
        "seconds (env WARMCACHE_PROGRESS_EVERY).",
    )(func)


@click.command("warmup")
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=str))
@count_option("--jobs", default=1, show_default=True, help="Worker processes, each claiming specs from the registry.")
@click.option(
    "--shard",
    metavar="I/N",
    default=None,
    help="Only the I-th of N deterministic slices of the manifest (1-based), for a fleet of machines.",
)
@click.option("--retry-failed", is_flag=True, help="Compile specs that failed in an earlier run again.")
@click.option("--dry-run", is_flag=True, help="Print what would be compiled and skipped; compile nothing.")
@cache_dir_option(CACHE_HELP)
@click.option(
    "--lease",
    "lease_seconds",
    type=click.FloatRange(min=1),
    default=None,
    help="Claim lease in seconds (default: the manifest's [registry] lease_seconds).",
)
@click.option(
    "--push/--no-push",
    "push",
    default=None,
    help="Publish each shape to the store as soon as it is compiled (default: the manifest's [store] push).",
)
@sign_option
@store_options
@db_option
@run_display_options
def warmup(
    manifest: str,
    jobs: int,
    shard: str | None,
    retry_failed: bool,
    dry_run: bool,
    cache_dir: CacheFolder | None,
    lease_seconds: float | None,
    push: bool | None,
    sign_key: str | None,
    store_url: str | None,
    endpoint_url: str | None,
    db_url: str | None,
    display: RunDisplay,
) -> int:
    """Compile every shape MANIFEST declares that is not yet compiled for this toolchain."""
    from warmcache.warmup.distributed import is_registry_writer
    from warmcache.warmup.runner import run_warmup
    from warmcache.warmup.summary import Shard, WarmupOptions

    parsed = load_manifest(manifest)
    publish = (parsed.store.push if push is None else push) and not dry_run
    key = signing_key(sign_key, parsed) if publish else None
    options = WarmupOptions(
        registry=registry_location(db_url, parsed, named_for="warmup --push --sign" if key else None),
        cache_dir=str(cache_dir) if cache_dir else None,
        lease_seconds=lease_seconds,
        jobs=jobs,
        shard=Shard.parse(shard) if shard else None,
        retry_failed=retry_failed,
        dry_run=dry_run,
    )
    publisher = None
    if publish:
        store = resolve_store(store_url, endpoint_url, parsed)
        publisher = ShapePublisher(parsed, options.registry, store, cache_dir, key)
    summary = run_warmup(parsed, options, display.progress("warmup"), publisher)
    if not is_registry_writer():
        return summary.exit_code  # under torchrun, rank 0 reports for the group
    return _finish(summary, display.as_json, publisher)


@click.command("verify")
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=str))
@cache_dir_option(CACHE_HELP)
@db_option
@run_display_options
def verify(manifest: str, cache_dir: CacheFolder | None, db_url: str | None, display: RunDisplay) -> int:
    """Replay every compiled shape of MANIFEST in a fresh process; exit 1 if anything compiled."""
    from warmcache.warmup.verify import run_verify

    parsed = load_manifest(manifest)
    summary = run_verify(
        parsed,
        registry_location(db_url, parsed),
        str(cache_dir) if cache_dir else None,
        display.progress("verify"),
    )
    return _finish(summary, display.as_json)
