"""Unpacking a bundle: trust nothing in it until every check has passed.

Refused, before anything is written: metadata nested deeper than any real one, a
missing or bad signature when trusted keys are configured, a member with an
absolute path or ``..``, a link, a device or any other special file, a file
missing from the file list (or listed but absent), rows or artifacts that name
unsafe paths or values the registry cannot hold, a toolchain that differs from
this machine's (unless ``force``), a file list larger than the unpack limit or
the free space, and any member whose content does not match its listed hash
(every member is hashed once before the first write). Then files are
extracted into a staging folder *inside* the target cache root (so the final
moves are same-filesystem renames), each file's sha256 and size are checked, and
only then is each entry moved into place with one rename and the rows merged
(idempotently, by identity). A bad bundle leaves the target as it was: rows are
validated completely before the first write, and if a move or the row merge still
fails, the moves are undone (originals put back, new entries removed).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import shutil
import tarfile
import uuid
import zlib
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from warmcache.bounds import MAX_BYTES, MAX_NESTING, json_nesting
from warmcache.cache.bundle import (
    BUNDLE_FORMAT,
    CACHE_PREFIX,
    META_NAME,
    BundleFile,
    Progress,
    check_relpath,
    sha256_of,
)
from warmcache.cache.bundle_rows import MergeResult, check_rows, merge_rows
from warmcache.cache.layout import (
    STAGING_PREFIX,
    WORK_DIR_PREFIX,
    CacheFlavor,
    entry_of,
)
from warmcache.cache.locate import (
    FLAVORS,
    CacheLocation,
    detect_flavor,
    flavor_of_kind,
    locate_caches,
)
from warmcache.errors import CacheError, UsageError, shown
from warmcache.fingerprint import current_toolchain
from warmcache.registry import Registry
from warmcache.settings import CacheFolder
from warmcache.trust import NOT_CONFIGURED, SignatureCheck, TrustedKeys, require_trust
from warmcache.units import format_size

_HEX = frozenset("0123456789abcdef")
#: The metadata is read into memory: a bundle of a million files needs a few hundred MB at most.
MAX_META_BYTES = 512 * 1024 * 1024
#: What one unpack may write unless told otherwise (``--max-size``, ``$WARMCACHE_MAX_UNPACK_SIZE``):
#: room for the Neuron cache of a large model, not for a disk-filling bundle.
DEFAULT_MAX_UNPACK_BYTES = 64 * 1024**3
#: What a truncated, corrupt or non-tar file raises while it is read.
_ARCHIVE_ERRORS = (tarfile.TarError, zlib.error, lzma.LZMAError, EOFError, gzip.BadGzipFile)


@dataclass(frozen=True, slots=True)
class BundleMeta:
    """The validated ``warmcache-bundle.json`` of a bundle."""

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


def unpack_bundle(
    bundle: Path,
    open_registry: Callable[[], Registry],
    *,
    cache_dir: CacheFolder | None = None,
    force: bool = False,
    trusted: TrustedKeys = NOT_CONFIGURED,
    allow_unsigned: bool = False,
    max_bytes: int = DEFAULT_MAX_UNPACK_BYTES,
    progress: Progress | None = None,
) -> UnpackResult:
    """Check ``bundle`` completely, then install its entries and merge its rows.

    The registry is opened (``open_registry``) only once every file has been
    checked in staging: a refused bundle must not leave a new, empty registry file
    behind. With ``trusted`` keys configured the metadata's signature is verified
    before anything else is believed; without them nothing is installed unless
    ``allow_unsigned`` (:func:`~warmcache.trust.require_trust`); ``max_bytes`` bounds what the file list may
    ask to write, checked before extraction and again while writing.
    """
    if not bundle.is_file():
        raise UsageError(f"{bundle}: bundle not found")
    require_trust(trusted, allow_unsigned, str(bundle))
    try:
        with tarfile.open(bundle, "r:*") as tar:
            members = tar.getmembers()
            meta = _read_meta(tar, members, bundle, trusted)
            file_members = _check_members(members, meta, bundle)
            if not force:
                _check_toolchain(meta, bundle)
            location = _target(cache_dir, meta.flavor)
            _check_layout_matches(location.root, meta.flavor, bundle)
            check_room(meta.files.values(), location.root, max_bytes, str(bundle))
            _verify_contents(tar, file_members, meta)
            return install_staged(meta, location, open_registry, lambda staging: _extract_all(tar, file_members, meta, staging, progress))
    except _ARCHIVE_ERRORS as exc:
        raise CacheError(f"{bundle}: not a readable bundle archive ({exc or type(exc).__name__}); refused") from None
    except OSError as exc:
        raise CacheError(f"{exc.filename or bundle}: {exc.strerror or exc}") from None


def _read_meta(tar: tarfile.TarFile, members: list[tarfile.TarInfo], bundle: Path, trusted: TrustedKeys) -> BundleMeta:
    if not members or members[0].name != META_NAME or not members[0].isfile():
        raise CacheError(f"{bundle}: not a warmcache bundle: its first member must be {META_NAME}")
    if members[0].size > MAX_META_BYTES:
        raise CacheError(f"{bundle}: {META_NAME} is {members[0].size} bytes, more than any real bundle needs ({MAX_META_BYTES}); refused")
    handle = tar.extractfile(members[0])
    assert handle is not None
    where = f"{bundle}: {META_NAME}"
    raw, signature, flavor = read_signed_document(handle.read(), where, "bundle", BUNDLE_FORMAT, trusted)
    files = check_files(raw.get("files"), flavor, where)
    rows = check_rows(raw.get("rows"), where)
    for index, row in enumerate(rows):
        check_artifacts(row, files, flavor, f"{where}: rows[{index}]")
    return BundleMeta(flavor, rows, files, signature)


def read_signed_document(data: bytes, where: str, what: str, expected_format: int, trusted: TrustedKeys) -> tuple[dict[str, Any], SignatureCheck, CacheFlavor]:
    """Parse a shipped file list (bundle metadata, store index): bounded nesting, its format, its
    signature when trusted keys are configured, then its cache layout.

    The signature is checked before any field is interpreted, so with trust configured
    nothing an attacker wrote is believed.
    """
    depth = json_nesting(data)
    if depth > MAX_NESTING:
        raise CacheError(f"{where}: nests {depth} levels deep; {what} metadata needs at most {MAX_NESTING}; refused")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise CacheError(f"{where} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != expected_format:
        raise CacheError(f"{where}: unsupported {what} format {shown(raw.get('format') if isinstance(raw, dict) else raw)} (this warmcache reads format {expected_format})")
    signature = trusted.check_document(raw, where)
    flavor = raw.get("flavor")
    if flavor not in FLAVORS:
        raise CacheError(f"{where}: unknown cache layout {shown(flavor)}")
    return raw, signature, flavor


def check_artifacts(row: dict[str, Any], files: dict[str, BundleFile], flavor: CacheFlavor, where: str) -> None:
    """Every artifact of a shipped row (bundle or store index) is a safe path, in this layout, with files listed beside it."""
    for artifact in row["artifacts"]:
        path = check_relpath(artifact["path"], f"{where} artifact")
        if flavor_of_kind(artifact["kind"]) != flavor:
            raise CacheError(f"{where} artifact {shown(path)} of kind {shown(artifact['kind'])} is not in a {flavor} cache")
        if not any(name == path or name.startswith(path + "/") for name in files):
            raise CacheError(f"{where} artifact {shown(path)} has no files listed")


def check_files(listed: Any, flavor: CacheFlavor, where: str) -> dict[str, BundleFile]:
    if not isinstance(listed, list):
        raise CacheError(f"{where}: 'files' must be a list")
    files: dict[str, BundleFile] = {}
    for index, item in enumerate(listed):
        if not isinstance(item, dict):
            raise CacheError(f"{where}: files[{index}] must be an object")
        path = check_relpath(item.get("path"), f"{where}: files[{index}]")
        digest, size = item.get("sha256"), item.get("size")
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
            raise CacheError(f"{where}: files[{index}] ({path}): sha256 {shown(digest)} is not a hex sha256")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BYTES:
            raise CacheError(f"{where}: files[{index}] ({path}): size {shown(size)} is not a byte count")
        if entry_of(flavor, path) is None:
            raise CacheError(f"{where}: files[{index}] {shown(path)} is not part of any {flavor} cache entry")
        if path in files:
            raise CacheError(f"{where}: files[{index}] {shown(path)} is listed twice")
        files[path] = BundleFile(path, digest, size)
    return files


def _check_members(members: list[tarfile.TarInfo], meta: BundleMeta, bundle: Path) -> dict[str, tarfile.TarInfo]:
    """Every member is the metadata, a folder, or a listed regular file; every listed file is there."""
    found: dict[str, tarfile.TarInfo] = {}
    for member in members[1:]:
        where = f"{bundle}: member {shown(member.name)}"
        if member.issym() or member.islnk():
            raise CacheError(f"{where} is a link (to {shown(member.linkname)}); bundles carry regular files only; refused")
        if member.ischr() or member.isblk() or member.isfifo():
            raise CacheError(f"{where} is a device or FIFO; bundles carry regular files only; refused")
        if not (member.isfile() or member.isdir()):
            raise CacheError(f"{where} is not a regular file or folder (tar type {shown(member.type)}); refused")
        name = check_relpath(member.name, where)
        if not name.startswith(CACHE_PREFIX) and not (member.isdir() and name + "/" == CACHE_PREFIX):
            raise CacheError(f"{where} lies outside {CACHE_PREFIX}; refused")
        if member.isdir():
            continue
        path = name[len(CACHE_PREFIX) :]
        if path not in meta.files:
            raise CacheError(f"{where} is not in the bundle's file list; refused")
        if path in found:
            raise CacheError(f"{where} appears twice; refused")
        if member.size != meta.files[path].size:
            # Checked before anything is written: a member larger than listed could fill the disk.
            raise CacheError(f"{where} holds {member.size} bytes but the file list says {meta.files[path].size}; refused")
        found[path] = member
    absent = sorted(set(meta.files) - set(found))
    if absent:
        raise CacheError(f"{bundle}: the file list names {CACHE_PREFIX}{absent[0]} but the bundle lacks it ({len(absent)} missing); refused")
    return found


def _check_toolchain(meta: BundleMeta, bundle: Path) -> None:
    for row in meta.rows:
        local = current_toolchain(row["device"], row["backend"], row["mode"])
        if row["toolchain_hash"] != local.hash:
            differences = "; ".join(_differences(row["toolchain"], local.as_dict())) or "fingerprint differs"
            raise CacheError(
                f"{bundle}: built with another toolchain than this machine's for {row['model_name']} "
                f"({differences}): its graphs would not load here; pass --force to unpack anyway (its rows then read stale)"
            )


def _differences(bundled: Any, local: Any, prefix: str = "") -> Iterable[str]:
    if isinstance(bundled, dict) and isinstance(local, dict):
        for key in sorted(set(bundled) | set(local)):
            yield from _differences(bundled.get(key), local.get(key), f"{prefix}{key}.")
    elif bundled != local:
        yield f"{prefix.rstrip('.')}: bundle {bundled}, here {local}"


def _check_layout_matches(root: Path, flavor: CacheFlavor, bundle: Path) -> None:
    """Refuse a bundle of another layout than the target folder holds.

    Entries are cut by the bundle's layout: a "neuron-native" bundle names whole
    top-level folders as entries, and unpacked into an Inductor cache it would
    replace ``aotautograd/`` wholesale.
    """
    held = [c for c in root.iterdir() if not c.name.startswith(WORK_DIR_PREFIX)] if root.is_dir() else []
    if held and detect_flavor(root) != flavor:
        raise CacheError(f"{bundle}: bundle of layout {flavor}, but {root} holds a cache of layout {detect_flavor(root)}; refused (pass another --cache-dir)")


def check_room(files: Collection[BundleFile], root: Path, max_bytes: int, source: str) -> None:
    """Refuse, before anything is fetched or extracted, a file list larger than the limit or
    than the free space at ``root`` (bundle unpack, and store pull for what it would fetch)."""
    total = sum(f.size for f in files)
    if total > max_bytes:
        raise CacheError(
            f"{source}: lists {len(files)} files of {format_size(total)} ({total} bytes), more than the unpack limit "
            f"of {format_size(max_bytes)}; refused (raise it with --max-size or $WARMCACHE_MAX_UNPACK_SIZE if you expect this)"
        )
    existing = next(p for p in (root, *root.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if total > free:
        raise CacheError(f"{source}: needs {format_size(total)} but {existing} has {format_size(free)} free; refused")


def _verify_contents(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], meta: BundleMeta) -> None:
    """Hash every member without writing it: a file that does not match its listed hash is refused
    before a byte of it reaches the disk (extraction then checks the hashes again as it writes)."""
    for path, member in _in_archive_order(members):
        source = tar.extractfile(member)
        assert source is not None
        expected = meta.files[path]
        _check_digest(_hash_blocks(_blocks(source), expected.size, None), expected, f"{CACHE_PREFIX}{path}")


def _in_archive_order(members: dict[str, tarfile.TarInfo]) -> list[tuple[str, tarfile.TarInfo]]:
    """Members as they lie in the archive: a compressed stream is read once, never rewound."""
    return sorted(members.items(), key=lambda item: item[1].offset_data)


def _target(cache_dir: CacheFolder | None, flavor: CacheFlavor) -> CacheLocation:
    locations = locate_caches(cache_dir, None, flavor)
    if not locations:
        raise UsageError(f"no default {flavor} cache folder on this machine; pass --cache-dir DIR")
    return locations[0]


def _extract_all(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], meta: BundleMeta, staging: Path, progress: Progress | None) -> None:
    total = sum(f.size for f in meta.files.values())
    done = 0
    for path, member in _in_archive_order(members):
        _extract_checked(tar, member, meta.files[path], staging / path)
        done += meta.files[path].size
        if progress:
            progress(done, total)


def _extract_checked(tar: tarfile.TarFile, member: tarfile.TarInfo, expected: BundleFile, target: Path) -> None:
    source = tar.extractfile(member)
    assert source is not None
    write_checked(_blocks(source), expected, target, where=f"{CACHE_PREFIX}{expected.path}", executable=bool(member.mode & 0o111))


def install_staged(meta: BundleMeta, location: CacheLocation, open_registry: Callable[[], AbstractContextManager[Registry]], stage: Callable[[Path], None]) -> UnpackResult:
    """Have ``stage`` write ``meta.files`` (hash-checked) into a staging folder, then install them.

    Shared by bundle unpack and store pull: the staging folder lies inside the cache
    root (same file system), each entry moves into place with one rename, and the rows
    are merged only after every entry is in place, so an interruption leaves no
    partial entry and no row naming a missing file. The registry is opened
    (``open_registry``) only once everything is staged and checked: a refused
    unpack or pull leaves no new, empty registry file behind.
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
        stage(staging)
        with open_registry() as registry:
            added, replaced, present = _move_into_place(meta, staging, parked, root, journal)
            rows = merge_rows(registry, meta.rows, str(root))
    except BaseException:
        _undo(journal)
        shutil.rmtree(staging, ignore_errors=True)
        if not any(move.original is not None and os.path.lexists(move.original) for move in journal):
            shutil.rmtree(parked, ignore_errors=True)  # else keep what could not be put back
        _remove_if_empty(created)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(parked, ignore_errors=True)
    return UnpackResult(root, added, replaced, present, len(meta.files), sum(f.size for f in meta.files.values()), rows, meta.signature)


def write_checked(blocks: Iterable[bytes], expected: BundleFile, target: Path, *, where: str, executable: bool = False) -> None:
    """Stream ``blocks`` to ``target`` (a new file, never through a link) and check size and sha256.

    The size is enforced while writing (bundle members and store blobs alike): a
    source longer than listed stops at the first block past it, so it can never fill the disk.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if executable else 0o644)
    with os.fdopen(fd, "wb") as out:
        _check_digest(_hash_blocks(blocks, expected.size, out), expected, where)


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
            f"(sha256 {digest[:16]}…, {size}{'+' if size > expected.size else ''} bytes; listed {expected.sha256[:16]}…, {expected.size} bytes): corrupt or tampered; refused"
        )


def _blocks(handle: IO[bytes]) -> Iterable[bytes]:
    return iter(lambda: handle.read(1 << 20), b"")


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


def _move_into_place(meta: BundleMeta, staging: Path, parked: Path, root: Path, journal: list[_Move]) -> tuple[int, int, int]:
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
                present += 1
                continue
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
            added, replaced, present = (added - 1, replaced, present + 1) if move.original is None else (added, replaced - 1, present + 1)
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
        except OSError:
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
        if path.is_symlink() or not path.is_file() or path.stat().st_size != file.size or sha256_of(path) != file.sha256:
            return False
    return True


def _remove_if_empty(created: list[Path]) -> None:
    """Remove the folders this unpack created (deepest first), as long as they are empty."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            return
