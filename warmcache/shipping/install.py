"""Installing checked cache files: the engine ``bundle unpack`` and ``store pull`` share.

The caller writes every file into a staging folder *inside* the target cache root (so
the final moves are same-filesystem renames), each one's sha256 and size checked as it
is written (:func:`write_checked`); only then is each entry moved into place with one
rename and the rows merged (idempotently, by identity). If a move or the row merge
fails, the moves are undone (originals put back, new entries removed), so a refused or
interrupted install leaves the target as it was. :func:`check_room` refuses, before
anything is fetched or extracted, a file list that would not fit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from warmcache.cache.layout import STAGING_PREFIX, CacheFlavor, entry_of
from warmcache.cache.locate import CacheLocation
from warmcache.cache.platform_mark import MARK, claim_for_rows
from warmcache.errors import CacheError
from warmcache.registry import Registry
from warmcache.shipping.bundle import BundleFile, sha256_of
from warmcache.shipping.bundle_rows import MergeResult, merge_rows
from warmcache.trust import SignatureCheck
from warmcache.units import format_size

log = logging.getLogger(__name__)

#: What one unpack may write unless told otherwise (``--max-size``, ``$WARMCACHE_MAX_UNPACK_SIZE``):
#: room for the Neuron cache of a large model, not for a disk-filling bundle.
DEFAULT_MAX_UNPACK_BYTES = 64 * 1024**3


@dataclass(frozen=True, slots=True)
class BundleMeta:
    """What to install: a bundle's validated ``warmcache-bundle.json``, or the indexes a pull found."""

    flavor: CacheFlavor
    rows: list[dict[str, Any]]
    files: dict[str, BundleFile]
    signature: SignatureCheck = SignatureCheck(checked=False, key_id=None)


@dataclass(frozen=True, slots=True)
class UnpackResult:
    root: Path
    added: int
    replaced: int
    already_present: int
    files: int
    bytes: int
    rows: MergeResult
    signature: SignatureCheck

    def as_json(self) -> dict[str, Any]:
        return {
            "cache_dir": str(self.root),
            "entries_added": self.added,
            "entries_replaced": self.replaced,
            "entries_already_present": self.already_present,
            "files": self.files,
            "bytes": self.bytes,
            "rows": self.rows.as_json(),
            "signature": self.signature.as_json(),
        }

    def message(self) -> str:
        """What ``bundle unpack`` says it installed, merged and skipped (its ``--json`` is :meth:`as_json`)."""
        lines = [
            f"{self.root}: {self.added} entries added, {self.replaced} replaced, {self.already_present} already "
            f"present ({self.files} files, {format_size(self.bytes)} checked); {self.rows.describe()}",
            self.signature.describe(),
        ]
        return "\n".join(lines + [f"  skipped row {line}" for line in self.rows.skipped])


def check_room(files: Collection[BundleFile], root: Path, max_bytes: int, source: str) -> None:
    """Refuse, before anything is fetched or extracted, a file list larger than the limit or
    than the free space at ``root`` (bundle unpack, and store pull for what it would fetch)."""
    total = sum(f.size for f in files)
    if total > max_bytes:
        raise CacheError(
            f"{source}: lists {len(files)} files of {format_size(total)} ({total} bytes), more than the unpack limit "
            f"of {format_size(max_bytes)}; refused (raise it with --max-size or "
            "$WARMCACHE_MAX_UNPACK_SIZE if you expect this)"
        )
    existing = next(p for p in (root, *root.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if total > free:
        raise CacheError(f"{source}: needs {format_size(total)} but {existing} has {format_size(free)} free; refused")


def install_staged(
    meta: BundleMeta,
    location: CacheLocation,
    open_registry: Callable[[], AbstractContextManager[Registry]],
    stage: Callable[[Path], None],
    source: str,
) -> UnpackResult:
    """Have ``stage`` write ``meta.files`` (hash-checked) into a staging folder, then install them.

    Shared by bundle unpack and store pull: the staging folder lies inside the cache
    root (same file system), each entry moves into place with one rename, and the rows
    are merged only after every entry is in place, so an interruption leaves no
    partial entry and no row naming a missing file. The registry is opened
    (``open_registry``) only once everything is staged and checked: a refused
    unpack or pull leaves no new, empty registry file behind. The folder is claimed
    for the platform the rows' Inductor CPU code was generated on first
    (:func:`~warmcache.cache.platform_mark.claim_for_rows`; ``source`` names the
    bundle or store in the refusal).
    """
    root = location.root
    created = [p for p in (root, *root.parents) if not p.exists()]
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = root / f"{STAGING_PREFIX}{token}"
    # Replaced originals wait in a sibling of the staging folder, never inside it: a
    # neuron-native entry may be named anything, ".replaced" included. The name keeps the
    # work-folder prefix, so scans skip it and doctor removes it if a crash leaves it.
    parked = root / f"{STAGING_PREFIX}{token}-replaced"
    staging.mkdir()
    journal: list[_Move] = []
    try:
        claim_for_rows(root, meta.rows, source)
        stage(staging)
        with open_registry() as registry:
            added, replaced, present = _move_into_place(meta, staging, parked, root, journal)
            rows = merge_rows(registry, meta.rows, str(root))
    except BaseException:
        _undo(journal)
        shutil.rmtree(staging, ignore_errors=True)
        if not any(move.original is not None and os.path.lexists(move.original) for move in journal):
            shutil.rmtree(parked, ignore_errors=True)  # else keep what could not be put back
        if created:  # the folder is new, so its mark is this install's
            (root / MARK).unlink(missing_ok=True)
        _remove_if_empty(created)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(parked, ignore_errors=True)
    return UnpackResult(
        root, added, replaced, present, len(meta.files), sum(f.size for f in meta.files.values()), rows, meta.signature
    )


def write_checked(
    blocks: Iterable[bytes], expected: BundleFile, target: Path, *, where: str, executable: bool = False
) -> None:
    """Stream ``blocks`` to ``target`` (a new file, never through a link) and check size and sha256.

    The size is enforced while writing (bundle members and store blobs alike): a
    source longer than listed stops at the first block past it, so it can never fill the disk.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if executable else 0o644)
    with os.fdopen(fd, "wb") as out:
        _check_digest(_hash_blocks(blocks, expected.size, out), expected, where)


def check_blocks(blocks: Iterable[bytes], expected: BundleFile, where: str) -> None:
    """Hash ``blocks`` without writing them; refuse them unless their size and sha256 are ``expected``'s."""
    _check_digest(_hash_blocks(blocks, expected.size, None), expected, where)


def _hash_blocks(blocks: Iterable[bytes], limit: int, out: IO[bytes] | None) -> tuple[str, int]:
    """sha256 and length of ``blocks``, written to ``out`` as they pass (when given).

    Stops at the first block that goes past ``limit``: enough to tell the source is
    too long, without reading (or writing) the rest of it.
    """
    digest = hashlib.sha256()
    size = 0
    for block in blocks:
        size += len(block)
        if size > limit:
            break
        digest.update(block)
        if out is not None:
            out.write(block)
    return digest.hexdigest(), size


def _check_digest(found: tuple[str, int], expected: BundleFile, where: str) -> None:
    digest, size = found
    if size != expected.size or digest != expected.sha256:
        raise CacheError(
            f"{where}: content does not match the listed sha256 and size "
            f"(sha256 {digest[:16]}…, {size}{'+' if size > expected.size else ''} bytes; listed "
            f"{expected.sha256[:16]}…, {expected.size} bytes): corrupt or tampered; refused"
        )


@dataclass(slots=True)
class _Move:
    """One step of installing an entry, recorded so that a failure later can be undone.

    ``original`` is where the entry that was at ``dest`` now waits (``None``: there was
    none); ``installed`` says whether the bundle's entry was renamed to ``dest``;
    ``new_dirs`` are the parent folders created for it.
    """

    dest: Path
    original: Path | None = None
    installed: bool = False
    new_dirs: tuple[Path, ...] = ()


def _move_into_place(
    meta: BundleMeta, staging: Path, parked: Path, root: Path, journal: list[_Move]
) -> tuple[int, int, int]:
    """Move each staged entry to its place with one rename; an identical entry already there is kept.

    Every rename is appended to ``journal`` as it happens, so that :func:`_undo` can
    restore the cache if a later entry or the row merge fails.
    """
    by_entry: dict[str, list[BundleFile]] = {}
    for path, file in meta.files.items():
        found = entry_of(meta.flavor, path)
        assert found is not None  # checked in check_files
        by_entry.setdefault(found[1], []).append(file)
    added = replaced = present = 0
    for index, (entry, files) in enumerate(sorted(by_entry.items())):
        dest = root / entry
        move = _Move(dest)
        if os.path.lexists(dest):
            if holds_files(root, files):
                log.debug("cache hit: %s already holds these files; kept", dest)
                present += 1
                continue
            log.debug("cache entry %s differs; replaced (the old one parked until the install succeeds)", dest)
            parked.mkdir(exist_ok=True)
            os.rename(dest, parked / str(index))
            move.original = parked / str(index)
            journal.append(move)
            replaced += 1
        else:
            move.new_dirs = tuple(p for p in dest.parents if p != root and root in p.parents and not p.exists())
            dest.parent.mkdir(parents=True, exist_ok=True)
            journal.append(move)
            added += 1
        try:
            os.rename(staging / entry, dest)
        except OSError:
            if not holds_files(root, files):
                raise
            # A concurrent unpack of the same entry won the race: it is present, not ours.
            log.debug("cache entry %s: a concurrent install put the same files there first", dest)
            added, replaced, present = (
                (added - 1, replaced, present + 1) if move.original is None else (added, replaced - 1, present + 1)
            )
            continue
        move.installed = True
    return added, replaced, present


def _undo(journal: list[_Move]) -> None:
    """Undo the moves of a failed unpack, newest first: remove what it installed, put originals back.

    Best effort: a step that fails leaves its original in the parked folder (which the
    caller then keeps) rather than hiding the error that triggered the undo.
    """
    for move in reversed(journal):
        try:
            if move.installed:
                _remove(move.dest)
            if move.original is not None and not os.path.lexists(move.dest):
                os.rename(move.original, move.dest)
            for folder in move.new_dirs:  # deepest first
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        except OSError as exc:
            log.warning("could not undo the install of %s (%s); run warmcache cache doctor", move.dest, exc)
            continue


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def holds_files(root: Path, files: list[BundleFile]) -> bool:
    """Whether the cache already has exactly these files (same bytes)."""
    for file in files:
        path = root / file.path
        if (
            path.is_symlink()
            or not path.is_file()
            or path.stat().st_size != file.size
            or sha256_of(path) != file.sha256
        ):
            return False
    return True


def _remove_if_empty(created: list[Path]) -> None:
    """Remove the folders this unpack created (deepest first), as long as they are empty."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            return
