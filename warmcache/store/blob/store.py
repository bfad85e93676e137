"""An S3 bucket or a folder as a :class:`~warmcache.store.interface.Store`: each call handed to its module here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.errors import UsageError
from warmcache.registry import Registry
from warmcache.shipping.bundle import ByteProgress
from warmcache.shipping.shipment import PushRequest
from warmcache.store.blob.maintenance import execute_object_gc, list_objects, plan_object_gc
from warmcache.store.blob.push import push_objects
from warmcache.store.blob.scrub import check_objects, repair_objects
from warmcache.store.blob.source import ObjectSource
from warmcache.store.interface import (
    DEFAULT_GC_GRACE_SECONDS,
    CheckReport,
    GcPlan,
    PullSource,
    PushResult,
    StoreListing,
)
from warmcache.store.objects import ObjectStore
from warmcache.store.oci.freshness import PushPolicy
from warmcache.trust import NOT_CONFIGURED, TrustedKeys


@dataclass(frozen=True, slots=True)
class BlobStore:
    """An object store as a store: a push adds blobs and indexes, nothing is tagged, signed per tag or expires."""

    objects: ObjectStore
    tagged = False

    @property
    def url(self) -> str:
        return self.objects.url

    def use_push_policy(self, policy: PushPolicy) -> None:
        if policy != PushPolicy():
            raise UsageError(f"{self.url}: only an oci:// tag has an expiry, keys to build on or a fresh start")

    def push(self, request: PushRequest, registry: Registry, progress: ByteProgress | None = None) -> PushResult:
        return push_objects(request, registry, self.objects, progress)

    def pull_source(self) -> PullSource:
        return ObjectSource(self.objects)

    def list(self) -> StoreListing:
        return list_objects(self.objects)

    def plan_gc(self, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, now: float | None = None) -> GcPlan:
        return plan_object_gc(self.objects, grace_seconds, now)

    def execute_gc(self, plan: GcPlan) -> int:
        return execute_object_gc(self.objects, plan)

    def check(
        self, trusted: TrustedKeys = NOT_CONFIGURED, progress: Callable[[int, int], None] | None = None
    ) -> tuple[CheckReport, Any]:
        return check_objects(self.objects, trusted, progress)

    def repair(self, report: CheckReport, named: Any, cache_root: Path) -> CheckReport:
        return repair_objects(self.objects, report, named, cache_root)
