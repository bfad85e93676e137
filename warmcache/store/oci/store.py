"""An ``oci://`` store: one repository of a registry as a :class:`~warmcache.store.interface.Store`.

Push writes the URL's tag (one image, merged with what the tag held); pull reads it; ``store
ls|gc|check`` cover every tag of the repository. Each operation is its own module of this
package; this class only hands the store interface's calls to them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmcache.registry import Registry
from warmcache.shipping.bundle import ByteProgress
from warmcache.shipping.shipment import PushRequest
from warmcache.store.interface import (
    DEFAULT_GC_GRACE_SECONDS,
    CheckReport,
    GcPlan,
    PullSource,
    PushResult,
    StoreListing,
)
from warmcache.store.oci.freshness import PushPolicy, TagMemory
from warmcache.store.oci.maintenance import (
    check_repository,
    execute_repository_gc,
    list_repository,
    plan_repository_gc,
)
from warmcache.store.oci.push import push_image
from warmcache.store.oci.repair import repair_repository
from warmcache.store.oci.repository import OciRepository
from warmcache.store_location import StoreLocation
from warmcache.trust import NOT_CONFIGURED, TrustedKeys


class OciStore(OciRepository):
    """``oci://HOST/REPOSITORY:TAG`` as a store: pushes build the tag, signed per tag and expiring."""

    tagged = True

    @classmethod
    def open(cls, url: str, memory: TagMemory | None = None) -> OciStore:
        """The store an ``oci://`` URL names (parsed as ``--store`` is): for callers that hold a URL, not a
        location."""
        return cls(StoreLocation.parse(url).oci_reference(), memory)

    def use_push_policy(self, policy: PushPolicy) -> None:
        policy.validity()  # checked before anything is read or sent
        self.push_policy = policy

    def push(self, request: PushRequest, registry: Registry, progress: ByteProgress | None = None) -> PushResult:
        return push_image(request, registry, self, progress)

    def pull_source(self) -> PullSource:
        return self

    def list(self) -> StoreListing:
        return list_repository(self)

    def plan_gc(self, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, now: float | None = None) -> GcPlan:
        return plan_repository_gc(self, grace_seconds, now)

    def execute_gc(self, plan: GcPlan) -> int:
        return execute_repository_gc(self, plan)

    def check(
        self, trusted: TrustedKeys = NOT_CONFIGURED, progress: Callable[[int, int], None] | None = None
    ) -> tuple[CheckReport, Any]:
        return check_repository(self, trusted, progress)

    def repair(self, report: CheckReport, named: Any, cache_root: Path) -> CheckReport:
        return repair_repository(self, report, named, cache_root)
