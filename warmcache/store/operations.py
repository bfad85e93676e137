"""Each store operation for any store URL: the object-store implementation (``s3://``, ``file://``) or the OCI image one
(``oci://``).

The object-store modules (:mod:`.push`, :mod:`.maintenance`, :mod:`.scrub`) know
nothing of OCI, and the OCI modules (:mod:`.oci`) build on their data types (the
indexes, a gc plan, a check report); only this module sees both kinds, so imports
point one way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from warmcache.cache.bundle import ByteProgress
from warmcache.cache.shipment import ShipmentScope
from warmcache.registry import Registry
from warmcache.store.maintenance import (
    DEFAULT_GC_GRACE_SECONDS,
    GcPlan,
    StoreListing,
    execute_object_gc,
    list_objects,
    plan_object_gc,
)
from warmcache.store.objects import ObjectStore
from warmcache.store.oci.maintenance import (
    check_repository,
    execute_repository_gc,
    list_repository,
    plan_repository_gc,
)
from warmcache.store.oci.push import push_image
from warmcache.store.oci.repair import repair_repository
from warmcache.store.oci.store import OciStore
from warmcache.store.push import PushResult, push_objects
from warmcache.store.scrub import CheckReport, check_objects, repair_objects
from warmcache.trust import NOT_CONFIGURED, SigningKey, TrustedKeys


def push_manifest(
    scope: ShipmentScope,
    registry: Registry,
    store: ObjectStore | OciStore,
    *,
    verified_only: bool = False,
    identities: Iterable[str] | None = None,
    signing_key: SigningKey | None = None,
    progress: ByteProgress | None = None,
) -> PushResult:
    """Publish the manifest's compiled shapes (only ``identities`` if given): new blobs and indexes, or merged into
    the tag's image."""
    options: dict[str, Any] = {
        "verified_only": verified_only,
        "identities": identities,
        "signing_key": signing_key,
        "progress": progress,
    }
    if isinstance(store, OciStore):
        return push_image(scope, registry, store, **options)
    return push_objects(scope, registry, store, **options)


def list_store(store: ObjectStore | OciStore) -> StoreListing:
    """Shapes per model and toolchain, and the stored files' count and size."""
    return list_repository(store) if isinstance(store, OciStore) else list_objects(store)


def plan_gc(
    store: ObjectStore | OciStore, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, now: float | None = None
) -> GcPlan:
    """What no index references (and old temporary files), read before anything is deleted."""
    return (
        plan_repository_gc(store, grace_seconds, now)
        if isinstance(store, OciStore)
        else plan_object_gc(store, grace_seconds, now)
    )


def execute_gc(store: ObjectStore | OciStore, plan: GcPlan) -> int:
    """Delete what the plan names and is still unreferenced; returns how many."""
    return execute_repository_gc(store, plan) if isinstance(store, OciStore) else execute_object_gc(store, plan)


def check_store(
    store: ObjectStore | OciStore,
    trusted: TrustedKeys = NOT_CONFIGURED,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[CheckReport, Any]:
    """The report, and what a repair needs (an object store: each referenced blob's cache paths; an OCI store: each
    damaged layer)."""
    return (
        check_repository(store, trusted, progress)
        if isinstance(store, OciStore)
        else check_objects(store, trusted, progress)
    )


def repair_store(store: ObjectStore | OciStore, report: CheckReport, named: Any, cache_root: Path) -> CheckReport:
    """Upload again what is damaged or missing and a file of ``cache_root`` holds; the report of what is left."""
    return (
        repair_repository(store, report, named, cache_root)
        if isinstance(store, OciStore)
        else repair_objects(store, report, named, cache_root)
    )
