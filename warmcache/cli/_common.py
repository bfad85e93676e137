"""What every command shares: the registry location, ``--json`` output, tables."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import click

from warmcache.errors import UsageError
from warmcache.manifest import Manifest
from warmcache.registry import Registry
from warmcache.settings import FOUND, REGISTRY, CacheFolder, RegistryLocation, resolve_cache_folder, resolve_registry
from warmcache.settings_table import MAX_UNPACK_SIZE
from warmcache.trust import SigningKey
from warmcache.units import format_size

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = (
    f"Registry database URL (default: ${REGISTRY.env}, then the manifest's "
    f"{REGISTRY.manifest_key}, then {REGISTRY.default})."
)


CACHE_DIR_HELP = (
    "Cache folder (default: $WARMCACHE_CACHE_DIR, the manifest's [cache] dir, then the compiler's default)."
)


def db_option(func: F) -> F:
    return click.option("--db", "db_url", metavar="URL", default=None, help=DB_HELP)(func)


def count_option(*names: str, **settings: Any) -> Callable[[F], F]:
    """An option taking a whole number of at least 1 (a batch size, a length, a count of workers or requests)."""
    return click.option(*names, type=click.IntRange(min=1), **settings)


def manifest_option(help: str, dest: str = "manifest_path") -> Callable[[F], F]:
    """``--manifest FILE``: where a command that takes no MANIFEST argument reads the settings ``help`` names."""
    return click.option("--manifest", dest, metavar="FILE", default=None, help=help)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of text.")(func)


def manifest_query_options(func: F) -> F:
    """MANIFEST, ``--model``, ``--db`` and ``--json``: what ``plan``, ``explain`` and ``status`` read."""
    func = db_option(json_option(func))
    func = click.option("--model", "model_name", default=None, help="Only this model.")(func)
    return click.argument("manifest", type=click.Path(dir_okay=False, path_type=str))(func)


def cache_dir_option(help: str) -> Callable[[F], F]:
    """``--cache-dir DIR``, resolved by :func:`cache_folder` (each command says what the folder is for in ``help``)."""
    return click.option("--cache-dir", callback=cache_folder, metavar="DIR", default=None, help=help)


def max_unpack_size_option(help: str) -> Callable[[F], F]:
    """``--max-size SIZE`` (or ``$WARMCACHE_MAX_UNPACK_SIZE``): the most a bundle unpack or a pull may write."""
    return click.option("--max-size", metavar="SIZE", envvar=MAX_UNPACK_SIZE.env, default=None, help=help)


def registry_location(
    db_url: str | None, manifest: Manifest | None = None, *, named_for: str | None = None
) -> RegistryLocation:
    """``--db``, then ``$WARMCACHE_DB``, then the manifest's ``[registry] url``, then the nearest project registry
    (if this user owns it), then the default (:func:`warmcache.settings.resolve_registry`).

    A registry found from the working folder was named by no one, so the command says which
    one it used (on stderr: ``--json`` output stays clean). A command that deletes by what the
    registry says or signs what it holds (``named_for`` says which, e.g. ``cache prune``)
    refuses a found one outright: a parent project's registry, or one left there by mistake,
    would decide what is deleted or signed, and the user named neither.
    """
    location = resolve_registry(db_url, manifest.registry if manifest else None)
    if location.source == FOUND:
        if named_for is not None:
            raise UsageError(
                f"{named_for} acts only on a registry named deliberately, and {location.sqlite_file} was {FOUND}: "
                f"name it with --db {location.sqlite_file} (or ${REGISTRY.env}, or the manifest's "
                f"{REGISTRY.manifest_key})"
            )
        click.echo(f"registry: {location.sqlite_file} ({FOUND}; --db names another)", err=True)
    return location


def cache_folder(_context: click.Context, _parameter: click.Parameter, value: str | None) -> CacheFolder | None:
    """``--cache-dir``'s callback: the flag, else ``$WARMCACHE_CACHE_DIR``, resolved once here (the manifest's comes
    after, per model)."""
    return resolve_cache_folder(value)


def load_signing_key(_context: click.Context, _parameter: click.Parameter, value: str | None) -> SigningKey | None:
    """``--sign``'s callback: the key is loaded (and a readable-by-others one refused) before any other work starts."""
    return SigningKey.load(value) if value else None


def sign_option(help: str) -> Callable[[F], F]:
    """``--sign KEY``, handed to the command as ``signing_key``, loaded by :func:`load_signing_key` (each command says
    what it signs in ``help``)."""
    return click.option("--sign", "signing_key", metavar="KEY", default=None, callback=load_signing_key, help=help)


def open_registry(
    db_url: str | None,
    manifest: Manifest | None = None,
    *,
    create: bool,
    writes: bool = False,
    named_for: str | None = None,
) -> Registry:
    """The registry the command names (``named_for``: see :func:`registry_location`).

    ``create=False`` for a command that does not make a registry: a missing one (or one
    without warmcache's schema) is then one line naming the command that makes one, never
    a new file, folder or schema, and the file is left as it was. Such a command that also
    never writes (``writes=False``: a query) opens a SQLite file read-only throughout.
    """
    location = registry_location(db_url, manifest, named_for=named_for)
    return Registry.open(location, create=create, read_only=not (create or writes))


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_result(result: Any, as_json: bool, text: Callable[[], str]) -> None:
    """What a command that produced one result prints: the result's own JSON with ``--json``, else ``text()``."""
    if as_json:
        print_json(result.as_json())
    else:
        click.echo(text())


def print_json_array(items: Iterable[Any]) -> None:
    """What ``print_json(list(items))`` prints, written item by item (a long listing is never held whole)."""
    out = sys.stdout
    empty = True
    for item in items:
        out.write(
            ("[\n  " if empty else ",\n  ")
            + json.dumps(item, indent=2, sort_keys=False, default=str).replace("\n", "\n  ")
        )
        empty = False
    out.write("[]\n" if empty else "\n]\n")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain left-aligned text table (numbers right-aligned)."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in cells if r[i]) and bool(cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in cells])


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def is_terminal() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def byte_progress(label: str) -> AbstractContextManager[Callable[[int, int], None]]:
    """A byte progress bar on a terminal; on CI a plain line at every quarter."""
    from warmcache.cli.progress import amount_progress

    return amount_progress(
        label,
        terminal=is_terminal(),
        steps=4,
        unit="B",
        line=lambda done, total: f"{label}: {format_size(done)} of {format_size(total)}",
    )


#: ``--trust KEY`` (repeatable): the keys whose signatures a bundle or store index must carry.
trust_option = click.option(
    "--trust",
    "trust",
    metavar="KEY",
    multiple=True,
    help="A trusted public key (ed25519:... or a .pub file); repeatable. Default: "
    "$WARMCACHE_TRUSTED_KEYS, then the manifest's [trust] keys.",
)
