"""The artifact store: compile once anywhere, start warm everywhere.

A store (``s3://bucket/prefix`` or ``file:///path``) holds compiled cache files as
content-addressed blobs and one index per compiled shape (:mod:`.index`);
:mod:`.push` publishes a manifest's compiled shapes, :mod:`.pull` installs exactly
what a manifest needs, :mod:`.maintenance` lists and garbage-collects. An OCI registry
(``oci://host/repository:tag``, :mod:`.oci`) holds the same indexes and files as a
container image: the same commands push, pull, list, collect and check it.
"""

from __future__ import annotations

from warmcache.errors import UsageError
from warmcache.manifest import Manifest
from warmcache.settings import STORE, choose
from warmcache.store.backends import open_store
from warmcache.store.objects import ObjectStore
from warmcache.store.oci.freshness import TagMemory
from warmcache.store.oci.store import OciStore
from warmcache.store_location import ACCEPTED_FORMS, StoreLocation

STORE_ENV = STORE.env
#: What push, pull and the store commands take: an object store, or one repository of an OCI registry.
Store = ObjectStore | OciStore


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
    if location.is_oci:
        return OciStore.open(location.url, memory)
    return open_store(location, endpoint_url or (manifest.store.endpoint_url if manifest else None))


__all__ = [
    "STORE_ENV",
    "ObjectStore",
    "OciStore",
    "Store",
    "open_store",
    "StoreLocation",
    "resolve_store",
    "store_location",
]
