"""The artifact store: compile once anywhere, start warm everywhere.

An object store (``s3://bucket/prefix`` or ``file:///path``, :mod:`.blob`) holds compiled
cache files as content-addressed blobs and one index per compiled shape (:mod:`.index`). An
OCI registry (``oci://host/repository:tag``, :mod:`.oci`) holds the same indexes and files as
a container image. Both answer one interface (:class:`~warmcache.store.interface.Store`):
push, the source a pull reads (:mod:`.pull` installs exactly what a manifest needs), list,
gc, check and repair. Which one a URL names is decided here, once, from the parsed location.
"""

from __future__ import annotations

from warmcache.errors import UsageError
from warmcache.manifest import Manifest
from warmcache.settings import STORE, choose
from warmcache.store.blob.backends import open_store
from warmcache.store.blob.store import BlobStore
from warmcache.store.interface import Store
from warmcache.store.oci.freshness import TagMemory
from warmcache.store.oci.store import OciStore
from warmcache.store_location import ACCEPTED_FORMS, StoreLocation

STORE_ENV = STORE.env


def store_location(cli_url: str | None, manifest: Manifest | None = None) -> StoreLocation:
    """``--store``, then ``$WARMCACHE_STORE``, then the manifest's ``[store] url`` (parsed with the manifest); the
    flag's and the variable's text parsed here, once, with the same forms."""
    from_manifest = manifest.store.url if manifest else None
    chosen = choose(STORE, cli_url, from_manifest.url if from_manifest else None, manifest.path if manifest else None)
    if chosen is None:
        raise UsageError(
            f"no store: pass --store ({ACCEPTED_FORMS}), set ${STORE_ENV}, or add [store] url to the manifest"
        )
    if from_manifest is not None and manifest is not None and chosen.source == STORE.sources(manifest.path)[2]:
        return from_manifest
    return StoreLocation.parse(chosen.text, chosen.source)


def resolve_store(
    cli_url: str | None, endpoint_url: str | None, manifest: Manifest | None = None, memory: TagMemory | None = None
) -> Store:
    """The store to use; for S3 the endpoint is ``--endpoint-url``, then ``[store] endpoint_url``, then boto3's own
    settings; an ``oci://`` store compares signed tags with ``memory`` (default: :meth:`TagMemory.resolve`)."""
    location = store_location(cli_url, manifest)
    if location.oci is not None:
        return OciStore(location.oci, memory)
    return BlobStore(open_store(location, endpoint_url or (manifest.store.endpoint_url if manifest else None)))


def resolve_tag_store(location: StoreLocation, memory: TagMemory | None = None) -> OciStore:
    """The ``oci://`` store a location names (``store promote`` copies signed tags); :class:`UsageError` naming the
    location's source for any other store."""
    return OciStore(location.oci_reference(), memory)


__all__ = [
    "STORE_ENV",
    "BlobStore",
    "OciStore",
    "Store",
    "open_store",
    "StoreLocation",
    "resolve_store",
    "resolve_tag_store",
    "store_location",
]
