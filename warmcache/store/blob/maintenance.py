"""``store ls`` and ``store gc``: what a store holds, and removing blobs no index names.

``gc`` follows :mod:`warmcache.cache.cleanup`: plan first (the dry run prints the
same plan), then act. It deletes only blobs older than a grace period: a push
uploads its blobs *before* the index that names them, so a young unreferenced
blob may belong to a push in flight. An index that cannot be read stops the
plan: deleting blobs on a partial view of the references would break shapes.

A push may also re-use an *old* unreferenced blob (it skips blobs already there),
so age alone does not protect it: push refreshes what it re-uses, and gc reads the
indexes again and ``stat``-s each blob right before deleting it (the rule below).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator

from warmcache.errors import CacheError, StoreError
from warmcache.store.blob.backends import FILE_TEMP_PREFIX
from warmcache.store.index import (
    BLOB_PREFIX,
    INDEX_PREFIX,
    MAX_INDEX_BYTES,
    blob_key,
    parse_index,
)
from warmcache.store.interface import DEFAULT_GC_GRACE_SECONDS, GcPlan, StoreGroup, StoreListing
from warmcache.store.objects import ObjectStore, StoredObject

#: The consistency rule between push and gc (docs/guides/store.md), in three numbers:
#: a push refreshes every re-used blob older than REFRESH_AGE_SECONDS and writes its indexes
#: within REFRESH_AGE_SECONDS of checking its blobs (else it refreshes them all); gc deletes
#: a blob within GC_DECISION_SECONDS of the stat that found it old, and only within
#: REFRESH_AGE_SECONDS of its last read of the indexes; push waits GC_DECISION_SECONDS
#: after a refresh, then uploads again any blob a gc took meanwhile. A grace of at least
#: MIN_SAFE_GRACE_SECONDS then guarantees no index ever names a missing blob.
REFRESH_AGE_SECONDS = 10 * 60.0
GC_DECISION_SECONDS = 2.0
MIN_SAFE_GRACE_SECONDS = 3 * REFRESH_AGE_SECONDS


def list_objects(store: ObjectStore) -> StoreListing:
    """Shapes per model and toolchain (from index keys alone), and the blobs' count and size."""
    groups: dict[tuple[str, str], list[StoredObject]] = defaultdict(list)
    for item in store.list(INDEX_PREFIX):
        parts = item.key[len(INDEX_PREFIX) :].split("/")
        if len(parts) == 3 and parts[2].endswith(".json"):
            groups[(parts[0], parts[1])].append(item)
    blobs = [b for b in store.list(BLOB_PREFIX) if is_blob(b.key)]
    return StoreListing(
        store.url,
        tuple(
            StoreGroup(model, toolchain, len(items), max(i.modified for i in items))
            for (model, toolchain), items in sorted(groups.items())
        ),
        len(blobs),
        sum(b.size for b in blobs),
    )


def plan_object_gc(
    store: ObjectStore, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, now: float | None = None
) -> GcPlan:
    """Which blobs no index references (and old temporary files), read before anything is deleted."""
    now = time.time() if now is None else now
    referenced, indexes = referenced_blobs(store)
    removals, young = [], 0
    for blob in store.list(BLOB_PREFIX):
        if blob.key in referenced and is_blob(blob.key):
            continue
        if now - blob.modified < grace_seconds:
            young += 1
        else:
            removals.append(blob)
    return GcPlan(store.url, indexes, len(referenced), tuple(removals), young, grace_seconds)


def stored_indexes(store: ObjectStore) -> Iterator[tuple[str, bytes]]:
    """``(key, bytes)`` of every index the store holds (one removed since the listing is skipped)."""
    for item in store.list(INDEX_PREFIX):
        if item.key.endswith(".json") and (data := store.read(item.key, MAX_INDEX_BYTES)) is not None:
            yield item.key, data


def referenced_blobs(store: ObjectStore) -> tuple[set[str], int]:
    """Every blob key some index names, and how many indexes there are; an unreadable index stops gc."""
    referenced: set[str] = set()
    indexes = 0
    for key, data in stored_indexes(store):
        try:
            index = parse_index(data, key, store.url)
        except CacheError as exc:  # an unreadable index: its blobs are unknown, so nothing may go
            raise StoreError(f"{exc}; gc refused: fix or delete this index first") from None
        referenced.update(blob_key(f.sha256) for f in index.files.values())
        indexes += 1
    return referenced, indexes


def execute_object_gc(store: ObjectStore, plan: GcPlan) -> int:
    """Delete the plan's objects that are still unreferenced and old; returns how many. Indexes are never touched.

    The consistency rule push relies on (:func:`warmcache.store.blob.push._refresh_reused`):
    the indexes are read again now (a push may have named a planned blob since), and
    each blob is ``stat``-ed again right before its delete, which is sent within
    :data:`GC_DECISION_SECONDS` of that ``stat`` (else it is left for the next run), and
    only within :data:`REFRESH_AGE_SECONDS` of that second read.
    """
    referenced, _ = referenced_blobs(store)
    read_at = time.monotonic()
    deleted = 0
    for item in plan.removals:
        if time.monotonic() - read_at > REFRESH_AGE_SECONDS:
            break  # the indexes read above are too old to decide on; the next run goes on
        if item.key in referenced and is_blob(item.key):
            continue
        checked = time.monotonic()
        current = store.stat(item.key)
        if current is None or time.time() - current.modified < plan.grace_seconds:
            continue  # gone, or refreshed by a push since the plan
        if time.monotonic() - checked < GC_DECISION_SECONDS / 2:
            store.delete(item.key)
            deleted += 1
    return deleted


def is_blob(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return not name.startswith(FILE_TEMP_PREFIX) and key == blob_key(name)
