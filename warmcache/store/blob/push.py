"""``push``: publish a manifest's compiled shapes to a store (what a bundle ships, object by object).

The shapes and their files are chosen exactly as :func:`~warmcache.shipping.bundle.pack_bundle`
chooses them (the entries each row names, plus every Inductor kernel file of the
cache, since kernels are shared between graphs and rows record only those they
wrote). Each file is one content-addressed blob, uploaded only if the store lacks
it, several at once (boto3 splits large ones into parallel parts). Then each
shape's index is written, after all of its blobs, and only when its bytes differ
from what the store holds: pushing twice, or from two hosts at once, is safe and
the second push writes nothing. An interrupted push resumes where it stopped:
blobs already there are skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from warmcache.registry import Registry
from warmcache.shipping.bundle import (
    ByteProgress,
)
from warmcache.shipping.shipment import PushRequest
from warmcache.store.blob.maintenance import GC_DECISION_SECONDS, REFRESH_AGE_SECONDS
from warmcache.store.index import MAX_INDEX_BYTES, blob_key, index_bytes, outgoing
from warmcache.store.interface import PushResult
from warmcache.store.objects import ObjectStore

log = logging.getLogger(__name__)

#: Blobs in flight at once (each large one also splits into parallel parts).
TRANSFER_THREADS = 8


def push_objects(
    request: PushRequest, registry: Registry, store: ObjectStore, progress: ByteProgress | None = None
) -> PushResult:
    """Upload what the store lacks of what ``request`` ships (:func:`~warmcache.store.index.outgoing`): the blobs
    first, then each index whose bytes the store does not hold (a puller that trusts the key tells a tampered one)."""
    out = outgoing(request, registry)
    records, root = out.records, request.scope.location.root
    blobs = {f.sha256: (root / f.path, f.size) for files in out.files.values() for f in files}
    checked_at = time.monotonic()
    uploaded, present, sent = _upload_missing(store, blobs, progress)
    indexes = [(key, index_bytes(index)) for key, index in out.indexes.items()]
    late = time.monotonic() - checked_at > REFRESH_AGE_SECONDS  # every check is old now: refresh every re-used blob
    again = _refresh_reused(
        store,
        sorted(sha for sha, modified in present.items() if late or time.time() - modified > REFRESH_AGE_SECONDS),
        blobs,
    )
    written = _write_indexes(store, indexes)
    return PushResult(
        store.url,
        len(records),
        written,
        len(records) - written,
        uploaded + again,
        len(present) - again,
        sent,
        out.not_compiled,
    )


def _write_indexes(store: ObjectStore, indexes: list[tuple[str, bytes]]) -> int:
    """Write each index whose bytes differ from the store's (every blob it names is in place); how many were written."""
    written = 0
    for key, data in indexes:
        if store.read(key, MAX_INDEX_BYTES) != data:
            store.write(key, data)
            written += 1
    return written


def _refresh_reused(store: ObjectStore, reused: list[str], blobs: dict[str, tuple[Path, int]]) -> int:
    """Make the old blobs this push re-uses young again, so ``store gc`` cannot take them from under the index about to
    name them.

    The store's consistency rule (:mod:`warmcache.store.blob.maintenance`): gc deletes a blob
    only if no index named it when its run started and when it decided, and its own
    ``stat`` of the blob, taken at most :data:`GC_DECISION_SECONDS` before the delete,
    showed it older than the grace period. So once this refresh is older than that
    window, a blob that is still there stays there; one deleted by a gc that looked
    before the refresh is uploaded again. Returns how many had to be uploaded again.
    """
    if not reused:
        return 0
    for sha256 in reused:
        store.touch(blob_key(sha256))
    time.sleep(GC_DECISION_SECONDS)
    gone = [sha256 for sha256 in reused if store.size_of(blob_key(sha256)) is None]
    for sha256 in gone:
        path, _ = blobs[sha256]
        store.upload(path, blob_key(sha256), sha256)
    return len(gone)


def _upload_missing(
    store: ObjectStore, blobs: dict[str, tuple[Path, int]], progress: ByteProgress | None
) -> tuple[int, dict[str, float], int]:
    """Upload each blob the store lacks or holds damaged, in parallel; ``(uploaded, {present sha256: last written},
    bytes sent)``.

    A blob of the right size is re-used only if its content is its name (S3's own
    checksum, or the file store's bytes hashed): a blob damaged in place is replaced.
    """
    total = sum(size for _, size in blobs.values())
    lock = threading.Lock()
    state = {"done": 0, "uploaded": 0, "sent": 0}
    present: dict[str, float] = {}

    def advance(nbytes: int, **counts: int) -> None:
        with lock:
            state["done"] += nbytes
            for name, value in counts.items():
                state[name] += value
            if progress:
                progress(state["done"], total)

    def one(sha256: str) -> None:
        path, size = blobs[sha256]
        key = blob_key(sha256)
        held = store.stat(key)
        if held is not None and held.size == size and store.sha256_of(key) == sha256:
            log.debug("blob %s: already in the store, not uploaded", sha256[:16])
            with lock:
                present[sha256] = held.modified
            advance(size)
            return
        log.debug(
            "blob %s: %s, uploading", sha256[:16], "missing from the store" if held is None else "damaged in the store"
        )
        store.upload(path, key, sha256, lambda nbytes: advance(nbytes))
        advance(0, uploaded=1, sent=size)

    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        for future in [pool.submit(one, sha256) for sha256 in sorted(blobs)]:
            future.result()
    return state["uploaded"], present, state["sent"]
