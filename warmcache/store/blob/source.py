"""An S3 or file store as a pull source: one index object per shape, read in parallel; one blob per file, each
streamed to disk with its size enforced while writing and its sha256 checked, fetched again once it does not match."""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError
from warmcache.identity.plan import PlannedShape
from warmcache.shipping.bundle import BundleFile, ByteProgress, sha256_of
from warmcache.shipping.install import write_checked
from warmcache.store.blob.push import TRANSFER_THREADS
from warmcache.store.index import MAX_INDEX_BYTES, ShapeIndex, blob_key, index_key, parse_index
from warmcache.store.objects import ObjectStore
from warmcache.trust import TrustedKeys

log = logging.getLogger(__name__)

#: A blob that does not match its hash is fetched this many times in all before the pull is refused.
FETCH_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ObjectSource:
    """An S3 or file store as a pull source: one index object per shape, one blob per file."""

    store: ObjectStore

    @property
    def url(self) -> str:
        return self.store.url

    def read_indexes(
        self, wanted: list[PlannedShape], location: CacheLocation, trusted: TrustedKeys
    ) -> dict[str, ShapeIndex]:
        return _read_indexes(self.store, wanted, location, trusted)

    def fetch_blobs(self, sizes: dict[str, int], folder: Path, progress: ByteProgress | None) -> tuple[int, int]:
        return _fetch_blobs(self.store, sizes, folder, progress)


def _read_indexes(
    store: ObjectStore, wanted: list[PlannedShape], location: CacheLocation, trusted: TrustedKeys
) -> dict[str, ShapeIndex]:
    """The validated (and, with ``trusted`` keys, signature-checked) index of each wanted shape the store holds, by
    identity."""

    def read(planned: PlannedShape) -> ShapeIndex | None:
        key = index_key(planned.model.name, planned.toolchain.hash, planned.identity)
        data = store.read(key, MAX_INDEX_BYTES)
        if data is None:
            return None
        index = parse_index(data, key, store.url, trusted)
        if index.flavor != location.flavor:
            raise CacheError(
                f"{store.url}/{key}: a {index.flavor} cache's shape, but {location.root} is a "
                f"{location.flavor} cache; refused"
            )
        return index

    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        indexes = list(pool.map(read, wanted))
    return {planned.identity: index for planned, index in zip(wanted, indexes) if index is not None}


def _fetch_blobs(
    store: ObjectStore, sizes: dict[str, int], folder: Path, progress: ByteProgress | None
) -> tuple[int, int]:
    """Every blob checked into ``folder`` (kept from an interrupted pull, or fetched); ``(downloaded, reused)``
    bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    total = sum(sizes.values())
    lock = threading.Lock()
    counts = {"done": 0, "downloaded": 0, "reused": 0}

    def advance(nbytes: int, kind: str | None = None) -> None:
        with lock:
            counts["done"] += nbytes
            if kind:
                counts[kind] += nbytes
            if progress:
                progress(counts["done"], total)

    def one(sha256: str) -> None:
        target, size = folder / sha256, sizes[sha256]
        if target.is_file() and target.stat().st_size == size and sha256_of(target) == sha256:
            log.debug("blob %s: kept from an earlier pull, not fetched again", sha256[:16])
            advance(size, "reused")
            return
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            partial = folder / f"{sha256}.part-{uuid.uuid4().hex[:8]}"
            counted = [0]
            try:
                write_checked(
                    _counted(store.blocks(blob_key(sha256)), advance, counted),
                    BundleFile(blob_key(sha256), sha256, size),
                    partial,
                    where=f"{store.url}/{blob_key(sha256)}",
                )
            except CacheError as exc:
                advance(-counted[0])  # the bytes of a refused fetch count again when they are fetched again, not twice
                partial.unlink(missing_ok=True)
                if attempt == FETCH_ATTEMPTS:
                    raise CacheError(f"{exc} (fetched {FETCH_ATTEMPTS} times)") from None
                log.debug(
                    "blob %s refused on fetch %d of %d, fetching again: %s", sha256[:16], attempt, FETCH_ATTEMPTS, exc
                )
                continue
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            os.replace(partial, target)
            with lock:
                counts["downloaded"] += size
            return

    with ThreadPoolExecutor(TRANSFER_THREADS) as pool:
        for future in [pool.submit(one, sha256) for sha256 in sorted(sizes)]:
            future.result()
    return counts["downloaded"], counts["reused"]


def _counted(blocks: Iterator[bytes], advance: Any, counted: list[int]) -> Iterator[bytes]:
    for block in blocks:
        advance(len(block))
        counted[0] += len(block)
        yield block
