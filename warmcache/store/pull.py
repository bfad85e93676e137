"""``pull``: fetch exactly what a manifest's declared shapes need from a store into the cache.

A shape whose row here is compiled/verified and whose entries are all in the cache
is skipped without asking the store (an unchanged cache pulls in one registry query
and an ``lstat`` per entry). For the rest, each shape's index is read (by the
identity this machine computes, so only indexes of its own toolchain are seen) and
validated completely (its signature first, when trusted keys are configured);
the files of entries the cache does not already hold are counted against the
size limit and the free space (:func:`~warmcache.cache.install.check_room`, as
``bundle unpack`` does) *before* anything is downloaded, then each blob is
streamed to disk with its size enforced while writing and its sha256 checked. A
blob that does not match is discarded and fetched again, then refused.

Blobs wait in ``.warmcache-unpack-pull/`` (named by sha256, renamed there only once
checked), so an interrupted pull (a store error, the deadline, a signal) resumes without
fetching them again; a pull that stops before any blob was checked leaves nothing, not even
the folders it created. Blobs are placed exactly as a bundle's files are
(:func:`~warmcache.cache.install.install_staged`:
a staging folder, one rename per entry, rows merged last). So an interrupted pull
leaves no partial entry and no row naming a missing file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from warmcache.cache.bundle import BundleFile, ByteProgress, sha256_of
from warmcache.cache.bundle_rows import MergeResult
from warmcache.cache.install import (
    DEFAULT_MAX_UNPACK_BYTES,
    BundleMeta,
    check_room,
    holds_files,
    install_staged,
    write_checked,
)
from warmcache.cache.layout import STAGING_PREFIX, entry_of
from warmcache.cache.locate import CacheLocation
from warmcache.cache.shipment import ShipmentScope
from warmcache.errors import CacheError
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.jsonable import fields_json
from warmcache.registry import Registry
from warmcache.settings import RegistryLocation
from warmcache.store.index import (
    MAX_INDEX_BYTES,
    ShapeIndex,
    blob_key,
    index_key,
    parse_index,
)
from warmcache.store.objects import ObjectStore
from warmcache.store.oci.store import OciStore
from warmcache.store.push import TRANSFER_THREADS
from warmcache.trust import NOT_CONFIGURED, TrustedKeys, require_trust

log = logging.getLogger(__name__)

#: Checked blobs of an unfinished pull; a work folder, so scans skip it and doctor clears an abandoned one.
BLOB_FOLDER = f"{STAGING_PREFIX}pull"
#: A blob that does not match its hash is fetched this many times in all before the pull is refused.
FETCH_ATTEMPTS = 3


class PullSource(Protocol):
    """Where a pull finds shapes and their files: an object store's indexes and blobs, or an OCI image's
    (:class:`~warmcache.store.oci.store.OciStore`)."""

    url: str

    def read_indexes(
        self, wanted: list[PlannedShape], location: CacheLocation, trusted: TrustedKeys
    ) -> dict[str, ShapeIndex]:
        """The validated (signature-checked, with ``trusted`` keys) index of each wanted shape the source holds, by
        identity."""

    def fetch_blobs(self, sizes: dict[str, int], folder: Path, progress: ByteProgress | None) -> tuple[int, int]:
        """Every file (by sha256) checked into ``folder/<sha256>``; ``(downloaded, reused)`` bytes."""


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


@dataclass(frozen=True, slots=True)
class PullResult:
    store: str
    cache_dir: Path
    already_present: int
    pulled: int
    missing: tuple[str, ...]
    entries_added: int
    entries_present: int
    files: int
    bytes_downloaded: int
    bytes_reused: int
    rows: MergeResult | None
    #: Whether every index read was checked against trusted keys (none are configured otherwise).
    signatures_checked: bool

    @property
    def exit_code(self) -> int:
        """1 while any declared shape is in neither the cache nor the store."""
        return 1 if self.missing else 0

    def as_json(self) -> dict[str, Any]:
        renamed = {
            "already_present": "shapes_already_present",
            "pulled": "shapes_pulled",
            "missing": "missing_in_store",
            "entries_present": "entries_already_present",
        }
        return {**fields_json(self, renamed), "ok": self.exit_code == 0}


def pull_manifest(
    scope: ShipmentScope,
    registry: RegistryLocation,
    store: ObjectStore | OciStore,
    *,
    max_bytes: int = DEFAULT_MAX_UNPACK_BYTES,
    trusted: TrustedKeys = NOT_CONFIGURED,
    allow_unsigned: bool = False,
    progress: ByteProgress | None = None,
) -> PullResult:
    """Install what the manifest's shapes need from ``store`` into the scope's cache folder and merge their rows.

    Every index is validated (and, with ``trusted`` keys, its signature verified)
    before the first byte is downloaded or written; without trusted keys nothing is
    pulled unless ``allow_unsigned``. The ``registry``
    is created only once everything is checked: a refused pull leaves no new, empty
    registry file (and no cache folder) behind.
    """
    source = store if isinstance(store, OciStore) else ObjectSource(store)
    require_trust(trusted, allow_unsigned, f"pull from {source.url}")
    planned = plan_manifest(scope.manifest, scope.model_name)
    location = scope.location
    # hashed once: a no-op pull of thousands of shapes is mostly this and one query
    identities = [p.identity for p in planned]
    present = {
        identity
        for identity, paths in _done_artifact_paths(registry, identities).items()
        if all(os.path.lexists(location.root / p) for p in paths)
    }
    wanted = [p for p, identity in zip(planned, identities) if identity not in present]
    log.debug(
        "pull from %s: skip %d shape(s) the registry and %s already hold; %d wanted",
        source.url,
        len(present),
        location.root,
        len(wanted),
    )
    found = source.read_indexes(wanted, location, trusted)
    missing = tuple(p.spec.describe() for p in wanted if p.identity not in found)
    for description in missing:
        log.debug("store miss: %s is not in %s", description, source.url)
    files, held = _files_to_install(list(found.values()), location)
    log.debug(
        "store hit: %d shape(s); %d cache entr(ies) already held, %d file(s) to fetch", len(found), held, len(files)
    )
    fetch = {f.sha256: f.size for f in files.values()}
    # what lands in the cache: a blob at two paths counts twice
    check_room(files.values(), location.root, max_bytes, source.url)
    common: dict[str, Any] = {
        "store": source.url,
        "cache_dir": location.root,
        "already_present": len(present),
        "pulled": len(found),
        "missing": missing,
        "signatures_checked": trusted.configured,
    }
    if not found:
        return PullResult(
            **common, entries_added=0, entries_present=0, files=0, bytes_downloaded=0, bytes_reused=0, rows=None
        )
    folder = location.root / BLOB_FOLDER
    meta = BundleMeta(location.flavor, [index.row for index in found.values()], files)
    created = [p for p in (location.root, *location.root.parents) if not p.exists()]
    try:
        downloaded, reused = source.fetch_blobs(fetch, folder, progress)
        result = install_staged(
            meta,
            location,
            lambda: Registry.open(registry),
            lambda staging: _link_files(files, folder, staging),
            f"store {source.url}",
        )
    # refused (a blob that is not what its index says): leave nothing; an interruption keeps checked blobs
    except CacheError:
        shutil.rmtree(folder, ignore_errors=True)
        for path in created:
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    except OSError as exc:  # a full or read-only disk: one line naming the path; checked blobs stay for the rerun
        _keep_only_resumable(folder, created)
        raise CacheError(f"{exc.filename or location.root}: {exc.strerror or exc}; pull not finished") from None
    except BaseException:  # the store failed or ran out of time, or an interruption: checked blobs stay for the rerun
        _keep_only_resumable(folder, created)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    return PullResult(
        **common,
        entries_added=result.added + result.replaced,
        entries_present=held + result.already_present,
        files=len(files),
        bytes_downloaded=downloaded,
        bytes_reused=reused,
        rows=result.rows,
    )


def _keep_only_resumable(folder: Path, created: list[Path]) -> None:
    """After a pull that did not finish: its checked blobs stay in ``folder`` so a rerun fetches them no more; with
    none, the folder goes, and so does every folder the pull created."""
    if folder.is_dir() and any(not p.name.startswith(".") and ".part-" not in p.name for p in folder.iterdir()):
        return
    shutil.rmtree(folder, ignore_errors=True)
    for path in created:
        with contextlib.suppress(OSError):
            path.rmdir()


def _done_artifact_paths(location: RegistryLocation, identities: list[str]) -> dict[str, list[str]]:
    """What the registry records as compiled among ``identities``; a SQLite file that does not exist yet records
    nothing (and is not created)."""
    if location.sqlite_file is not None and not location.sqlite_file.exists():
        return {}
    with Registry.open(location) as registry:
        return registry.done_artifact_paths(identities)


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


def _files_to_install(indexes: list[ShapeIndex], location: CacheLocation) -> tuple[dict[str, BundleFile], int]:
    """The files of every entry the indexes name that the cache does not already hold exactly, and how many it holds."""
    files: dict[str, BundleFile] = {}
    for index in indexes:
        for path, file in index.files.items():
            known = files.setdefault(path, file)
            if known != file:
                raise CacheError(
                    f"{index.key}: lists {path} with sha256 {file.sha256[:16]}…, another index with "
                    f"{known.sha256[:16]}…; refused"
                )
    by_entry: dict[str, list[BundleFile]] = {}
    for path, file in files.items():
        found = entry_of(location.flavor, path)
        assert found is not None  # checked by parse_index
        by_entry.setdefault(found[1], []).append(file)
    missing = [entry_files for entry_files in by_entry.values() if not holds_files(location.root, entry_files)]
    return {f.path: f for entry_files in missing for f in entry_files}, len(by_entry) - len(missing)


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


def _link_files(files: dict[str, BundleFile], folder: Path, staging: Path) -> None:
    """Put each file in the staging folder as a hard link to its checked blob (a copy where links fail)."""
    for path, file in files.items():
        target = staging / path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / file.sha256, target)
        except OSError:
            shutil.copyfile(folder / file.sha256, target)
