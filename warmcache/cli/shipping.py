"""What ``bundle pack``, ``push`` and ``pull`` start from: the manifest, its one cache folder, its registry and a
byte progress."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from warmcache.cache.locate import single_location
from warmcache.cli._common import CACHE_DIR_HELP, byte_progress, cache_dir_option, db_option, open_registry
from warmcache.manifest import Manifest, load_manifest
from warmcache.registry import Registry
from warmcache.settings import CacheFolder
from warmcache.shipping.shipment import ShipmentScope

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Shipment:
    """A manifest's shapes about to travel between a cache folder and a bundle or store.

    Checked before anything is opened: a bad manifest or an ambiguous cache folder is
    refused before the registry is touched.
    """

    scope: ShipmentScope
    db_url: str | None

    @classmethod
    def prepare(
        cls, manifest_path: str, cache_dir: CacheFolder | None, model_name: str | None, db_url: str | None
    ) -> Shipment:
        manifest = load_manifest(manifest_path)
        return cls(ShipmentScope(manifest, single_location(manifest, cache_dir, model_name), model_name), db_url)

    @property
    def manifest(self) -> Manifest:
        return self.scope.manifest

    @contextmanager
    def opened(self, label: str, signing: str | None = None) -> Iterator[tuple[Registry, Callable[[int, int], None]]]:
        """The registry (``--db``, ``$WARMCACHE_DB``, the manifest's, the default) and a byte progress named
        ``label``; a command that signs what it ships (``signing`` names it) needs that registry named, not found."""
        # pack and push only read rows
        with (
            open_registry(self.db_url, self.manifest, create=False, named_for=signing) as registry,
            byte_progress(label) as progress,
        ):
            yield registry, progress


def shipment_arguments(command: Callable[..., int | None]) -> Callable[..., int | None]:
    """MANIFEST, ``--model``, ``--cache-dir`` and ``--db``, handed to ``command`` as one prepared :class:`Shipment` (its
    ``shipment`` argument).

    The preamble ``bundle pack``, ``push`` and ``pull`` share, declared and run once: the
    manifest and its cache folder are checked before the command's own code runs.
    """

    @functools.wraps(command)
    def prepared(
        manifest: str, model_name: str | None, cache_dir: CacheFolder | None, db_url: str | None, **options: Any
    ) -> int | None:
        return command(shipment=Shipment.prepare(manifest, cache_dir, model_name, db_url), **options)

    prepared = cache_dir_option(CACHE_DIR_HELP)(db_option(prepared))
    prepared = click.option("--model", "model_name", default=None, help="Only this model's shapes.")(prepared)
    return click.argument("manifest", type=click.Path(dir_okay=False, path_type=str))(prepared)


def verified_only_option(func: F) -> F:
    """``--verified-only``: what ``bundle pack`` and ``push`` ship
    (:func:`~warmcache.shipping.shipment.records_to_ship`)."""
    return click.option(
        "--verified-only", is_flag=True, help="Only shapes warmcache verify proved (default: compiled and verified)."
    )(func)
