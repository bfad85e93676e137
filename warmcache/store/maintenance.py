"""``store ls`` and ``store gc``: what a store holds, and removing blobs no index names.

``gc`` follows :mod:`warmcache.cache.cleanup`: plan first (the dry run prints the
same plan), then act. It deletes only blobs older than a grace period: a push
uploads its blobs *before* the index that names them, so a young unreferenced
blob may belong to a push in flight. An index that cannot be read stops the
plan: deleting blobs on a partial view of the references would break shapes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from warmcache.errors import CacheError, StoreError
from warmcache.store.backends import FILE_TEMP_PREFIX, ObjectStore, StoredObject
from warmcache.store.index import (
    BLOB_PREFIX,
    INDEX_PREFIX,
    MAX_INDEX_BYTES,
    blob_key,
    parse_index,
)

#: A push of a large cache takes minutes to hours between its first blob and its last index.
DEFAULT_GC_GRACE_SECONDS = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class StoreGroup:
    """The shapes a store holds for one model and toolchain."""

    model: str
    toolchain_hash: str
    shapes: int
    newest: float

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "toolchain_hash": self.toolchain_hash, "shapes": self.shapes, "newest": self.newest}


@dataclass(frozen=True, slots=True)
class StoreListing:
    url: str
    groups: tuple[StoreGroup, ...]
    blobs: int
    blob_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"store": self.url, "groups": [g.as_json() for g in self.groups], "blobs": self.blobs, "blob_bytes": self.blob_bytes}


def list_store(store: ObjectStore) -> StoreListing:
    """Shapes per model and toolchain (from index keys alone), and the blobs' count and size."""
    groups: dict[tuple[str, str], list[StoredObject]] = defaultdict(list)
    for item in store.list(INDEX_PREFIX):
        parts = item.key[len(INDEX_PREFIX) :].split("/")
        if len(parts) == 3 and parts[2].endswith(".json"):
            groups[(parts[0], parts[1])].append(item)
    blobs = [b for b in store.list(BLOB_PREFIX) if _is_blob(b.key)]
    return StoreListing(
        store.url,
        tuple(StoreGroup(model, toolchain, len(items), max(i.modified for i in items)) for (model, toolchain), items in sorted(groups.items())),
        len(blobs),
        sum(b.size for b in blobs),
    )


@dataclass(frozen=True, slots=True)
class GcPlan:
    url: str
    indexes: int
    referenced: int
    #: Unreferenced blobs and leftover temporary files old enough to go.
    removals: tuple[StoredObject, ...]
    #: Unreferenced but younger than the grace period (a push may be writing its index).
    kept_young: int

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


def plan_gc(store: ObjectStore, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, now: float | None = None) -> GcPlan:
    """Which blobs no index references (and old temporary files), read before anything is deleted."""
    now = time.time() if now is None else now
    referenced: set[str] = set()
    indexes = 0
    for item in store.list(INDEX_PREFIX):
        if not item.key.endswith(".json"):
            continue
        data = store.read(item.key, MAX_INDEX_BYTES)
        if data is None:
            continue  # replaced or removed since the listing
        try:
            index = parse_index(data, item.key, store.url)
        except CacheError as exc:  # an unreadable index: its blobs are unknown, so nothing may go
            raise StoreError(f"{exc}; gc refused: fix or delete this index first") from None
        referenced.update(blob_key(f.sha256) for f in index.files.values())
        indexes += 1
    removals, young = [], 0
    for blob in store.list(BLOB_PREFIX):
        if blob.key in referenced and _is_blob(blob.key):
            continue
        if now - blob.modified < grace_seconds:
            young += 1
        else:
            removals.append(blob)
    return GcPlan(store.url, indexes, len(referenced), tuple(removals), young)


def execute_gc(store: ObjectStore, plan: GcPlan) -> int:
    """Delete the plan's objects; returns how many. Indexes are never touched."""
    for item in plan.removals:
        store.delete(item.key)
    return len(plan.removals)


def _is_blob(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return not name.startswith(FILE_TEMP_PREFIX) and key == blob_key(name)
