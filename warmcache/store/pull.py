"""``pull``: fetch exactly what a manifest's declared shapes need from a store into the cache.

A shape whose row here is compiled/verified and whose entries are all in the cache
is skipped without asking the store (an unchanged cache pulls in one registry query
and an ``lstat`` per entry). For the rest, each shape's index is read (by the
identity this machine computes, so only indexes of its own toolchain are seen) and
validated completely (its signature first, when trusted keys are configured);
the files of entries the cache does not already hold are counted against the
size limit and the free space (:func:`~warmcache.shipping.install.check_room`, as
``bundle unpack`` does) *before* anything is downloaded, then each blob is
streamed to disk with its size enforced while writing and its sha256 checked. A
blob that does not match is discarded and fetched again, then refused.

Blobs wait in ``.warmcache-unpack-pull/`` (named by sha256, renamed there only once
checked), so an interrupted pull (a store error, the deadline, a signal) resumes without
fetching them again; a pull that stops before any blob was checked leaves nothing, not even
the folders it created. Blobs are placed exactly as a bundle's files are
(:func:`~warmcache.shipping.install.install_staged`:
a staging folder, one rename per entry, rows merged last). So an interrupted pull
leaves no partial entry and no row naming a missing file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.cache.layout import STAGING_PREFIX, entry_of
from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError, ExitCode
from warmcache.identity.plan import plan_manifest
from warmcache.jsonable import fields_json
from warmcache.registry import Registry
from warmcache.settings import RegistryLocation
from warmcache.shipping.bundle import BundleFile, ByteProgress
from warmcache.shipping.bundle_rows import MergeResult
from warmcache.shipping.install import (
    DEFAULT_MAX_UNPACK_BYTES,
    BundleMeta,
    check_room,
    holds_files,
    install_staged,
)
from warmcache.shipping.shipment import ShipmentScope
from warmcache.store.index import (
    ShapeIndex,
)
from warmcache.store.interface import Store
from warmcache.trust import NOT_CONFIGURED, TrustedKeys, require_trust

log = logging.getLogger(__name__)

#: Checked blobs of an unfinished pull; a work folder, so scans skip it and doctor clears an abandoned one.
BLOB_FOLDER = f"{STAGING_PREFIX}pull"


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
    def exit_code(self) -> ExitCode:
        """:attr:`~ExitCode.NOT_DONE` (1) while any declared shape is in neither the cache nor the store."""
        return ExitCode.NOT_DONE if self.missing else ExitCode.OK

    def as_json(self) -> dict[str, Any]:
        renamed = {
            "already_present": "shapes_already_present",
            "pulled": "shapes_pulled",
            "missing": "missing_in_store",
            "entries_present": "entries_already_present",
        }
        return {**fields_json(self, renamed), "ok": self.exit_code is ExitCode.OK}


def pull_manifest(
    scope: ShipmentScope,
    registry: RegistryLocation,
    store: Store,
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
    source = store.pull_source()
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


def _link_files(files: dict[str, BundleFile], folder: Path, staging: Path) -> None:
    """Put each file in the staging folder as a hard link to its checked blob (a copy where links fail)."""
    for path, file in files.items():
        target = staging / path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(folder / file.sha256, target)
        except OSError:
            shutil.copyfile(folder / file.sha256, target)
