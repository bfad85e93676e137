"""What ``bundle pack``, ``push`` and ``pull`` start from: the manifest, its one cache folder, its registry and a byte progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from warmcache.cache.locate import CacheLocation, single_location
from warmcache.cli._common import byte_progress, open_registry
from warmcache.manifest import Manifest, load_manifest
from warmcache.registry import Registry
from warmcache.settings import CacheFolder


@dataclass(frozen=True, slots=True)
class Shipment:
    """A manifest's shapes about to travel between a cache folder and a bundle or store.

    Checked before anything is opened: a bad manifest or an ambiguous cache folder is
    refused before the registry is touched.
    """

    manifest: Manifest
    location: CacheLocation
    db_url: str | None

    @classmethod
    def prepare(cls, manifest_path: str, cache_dir: CacheFolder | None, model_name: str | None, db_url: str | None) -> Shipment:
        manifest = load_manifest(manifest_path)
        return cls(manifest, single_location(manifest, cache_dir, model_name), db_url)

    @contextmanager
    def opened(self, label: str) -> Iterator[tuple[Registry, Callable[[int, int], None]]]:
        """The registry (``--db``, ``$WARMCACHE_DB``, the manifest's, the default) and a byte progress named ``label``."""
        with open_registry(self.db_url, self.manifest) as registry, byte_progress(label) as progress:
            yield registry, progress
