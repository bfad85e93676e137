"""What every store answers, whatever it is: the :class:`Store` interface and what its operations return.

An S3 bucket or a folder (:mod:`.blob`) and a repository of an OCI registry (:mod:`.oci`) are
told apart once, where the store URL is parsed (:func:`warmcache.store.resolve_store`); push,
pull and the ``store`` commands then ask the store itself. The results are shared so that
``--json`` and the printed lines are the same for every kind of store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from warmcache.cache.locate import CacheLocation
from warmcache.errors import ExitCode
from warmcache.identity.plan import PlannedShape
from warmcache.jsonable import FieldsJson, fields_json
from warmcache.registry import Registry
from warmcache.shipping.bundle import ByteProgress, ShippedJson
from warmcache.shipping.shipment import PushRequest
from warmcache.store.index import ShapeIndex
from warmcache.store.objects import StoredObject
from warmcache.store.oci.freshness import PushPolicy
from warmcache.trust import NOT_CONFIGURED, TrustedKeys
from warmcache.units import format_size

#: A push of a large cache takes minutes to hours between its first blob and its last index.
DEFAULT_GC_GRACE_SECONDS = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class StoreGroup(FieldsJson):
    """The shapes a store holds for one model and toolchain."""

    model: str
    toolchain_hash: str
    shapes: int
    newest: float
    #: The OCI tag holding these shapes (an S3 or file store has no tags).
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class StoreListing:
    url: str
    groups: tuple[StoreGroup, ...]
    blobs: int
    blob_bytes: int

    def as_json(self) -> dict[str, Any]:
        return fields_json(self, {"url": "store"})


@dataclass(frozen=True, slots=True)
class GcPlan:
    url: str
    indexes: int
    referenced: int
    #: Unreferenced blobs and leftover temporary files old enough to go.
    removals: tuple[StoredObject, ...]
    #: Unreferenced but younger than the grace period (a push may be writing its index).
    kept_young: int
    grace_seconds: float = DEFAULT_GC_GRACE_SECONDS

    @property
    def freed_bytes(self) -> int:
        return sum(r.size for r in self.removals)

    def as_json(self) -> dict[str, Any]:
        return {
            "store": self.url,
            "indexes": self.indexes,
            "referenced_blobs": self.referenced,
            "remove": [{"key": r.key, "size_bytes": r.size} for r in self.removals],
            "kept_young": self.kept_young,
            "freed_bytes": self.freed_bytes,
        }


@dataclass(frozen=True, slots=True)
class StoreProblem(FieldsJson):
    key: str
    #: ``damaged`` (a blob whose bytes are not its name), ``missing`` (named by an index, not stored) or ``index``.
    problem: str
    detail: str


@dataclass(frozen=True, slots=True)
class CheckReport:
    url: str
    indexes: int
    blobs: int
    problems: tuple[StoreProblem, ...]
    repaired: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        """:attr:`~ExitCode.CACHE` (5) while anything is still wrong."""
        return ExitCode.CACHE if self.problems else ExitCode.OK

    def as_json(self) -> dict[str, Any]:
        return {**fields_json(self, {"url": "store"}), "ok": not self.problems}


@dataclass(frozen=True, slots=True)
class PushResult(ShippedJson):
    store: str
    shapes: int
    indexes_written: int
    indexes_unchanged: int
    blobs_uploaded: int
    blobs_present: int
    bytes_uploaded: int
    not_compiled: int

    def message(self, verified_only: bool) -> str:
        """What ``push`` says it sent, found already there and left out."""
        return (
            f"{self.store}: {self.shapes} shapes ({self.indexes_written} indexes written, "
            f"{self.indexes_unchanged} unchanged); {self.blobs_uploaded} files uploaded "
            f"({format_size(self.bytes_uploaded)}), {self.blobs_present} already there"
            + self.not_shipped(verified_only, "not pushed")
        )


class PullSource(Protocol):
    """Where a pull finds shapes and their files: an object store's indexes and blobs, or an OCI image's."""

    @property
    def url(self) -> str: ...

    def read_indexes(
        self, wanted: list[PlannedShape], location: CacheLocation, trusted: TrustedKeys
    ) -> dict[str, ShapeIndex]:
        """The validated (signature-checked, with ``trusted`` keys) index of each wanted shape the source holds, by
        identity."""

    def fetch_blobs(self, sizes: dict[str, int], folder: Path, progress: ByteProgress | None) -> tuple[int, int]:
        """Every file (by sha256) checked into ``folder/<sha256>``; ``(downloaded, reused)`` bytes."""


class Store(Protocol):
    """What ``push``, ``pull``, ``warmup --push`` and ``store ls|gc|check`` ask of a store."""

    @property
    def url(self) -> str:
        """The store as warmcache prints it."""

    @property
    def tagged(self) -> bool:
        """Whether a push writes one tag (``oci://``), built on what the tag held, signed per tag and expiring;
        an object store's pushes add objects."""

    def use_push_policy(self, policy: PushPolicy) -> None:
        """How the next push signs and what it builds on (checked now, before anything is read or sent); a store
        that is not :attr:`tagged` refuses any but the default."""

    def push(self, request: PushRequest, registry: Registry, progress: ByteProgress | None = None) -> PushResult:
        """Publish what ``request`` ships: the scope's compiled shapes (only its ``identities``, if it names some)."""

    def pull_source(self) -> PullSource:
        """What a pull reads this store through."""

    def list(self) -> StoreListing:
        """Shapes per model and toolchain, and the stored files' count and size."""

    def plan_gc(self, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, now: float | None = None) -> GcPlan:
        """What no index references (and old temporary files), read before anything is deleted."""

    def execute_gc(self, plan: GcPlan) -> int:
        """Delete what the plan names and is still unreferenced; returns how many."""

    def check(
        self, trusted: TrustedKeys = NOT_CONFIGURED, progress: Callable[[int, int], None] | None = None
    ) -> tuple[CheckReport, Any]:
        """The report, and what :meth:`repair` needs of it (an object store: each referenced blob's cache paths; an
        OCI store: each damaged layer)."""

    def repair(self, report: CheckReport, named: Any, cache_root: Path) -> CheckReport:
        """Upload again what is damaged or missing and a file of ``cache_root`` holds; the report of what is left."""
