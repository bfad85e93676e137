"""Unpacking a bundle: trust nothing in it until every check has passed.

Refused, before anything is written: metadata nested deeper than any real one, a
missing or bad signature when trusted keys are configured, a member with an
absolute path or ``..``, a link, a device or any other special file, a file
missing from the file list (or listed but absent), rows or artifacts that name
unsafe paths or values the registry cannot hold, a toolchain that differs from
this machine's (unless ``force``), a file list larger than the unpack limit or
the free space, and any member whose content does not match its listed hash
(every member is hashed once before the first write). Rows are validated
completely before the first write. Then the files are extracted, each one's
sha256 and size checked as it is written, into a staging folder and installed as
:mod:`warmcache.shipping.install` does for a pull too: one rename per entry, rows
merged last, every move undone if a later one or the merge fails.
"""

from __future__ import annotations

import gzip
import lzma
import tarfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from warmcache.cache.layout import WORK_DIR_PREFIX, CacheFlavor
from warmcache.cache.locate import CacheLocation, detect_flavor, locate_caches
from warmcache.errors import CacheError, UsageError, shown
from warmcache.identity.fingerprint import current_toolchain
from warmcache.registry import Registry
from warmcache.settings import CacheFolder
from warmcache.shipping.bundle import (
    BUNDLE_FORMAT,
    CACHE_PREFIX,
    META_NAME,
    BundleFile,
    ByteProgress,
    check_relpath,
)
from warmcache.shipping.bundle_rows import check_rows
from warmcache.shipping.file_list import check_artifacts, check_files, read_signed_document
from warmcache.shipping.install import (
    DEFAULT_MAX_UNPACK_BYTES,
    BundleMeta,
    UnpackResult,
    check_blocks,
    check_room,
    install_staged,
    write_checked,
)
from warmcache.trust import NOT_CONFIGURED, TrustedKeys, require_trust

#: The metadata is read into memory: a bundle of a million files needs a few hundred MB at most.
MAX_META_BYTES = 512 * 1024 * 1024
#: What a truncated, corrupt or non-tar file raises while it is read.
_ARCHIVE_ERRORS = (tarfile.TarError, zlib.error, lzma.LZMAError, EOFError, gzip.BadGzipFile)


def unpack_bundle(
    bundle: Path,
    open_registry: Callable[[], Registry],
    *,
    cache_dir: CacheFolder | None = None,
    force: bool = False,
    trusted: TrustedKeys = NOT_CONFIGURED,
    allow_unsigned: bool = False,
    max_bytes: int = DEFAULT_MAX_UNPACK_BYTES,
    progress: ByteProgress | None = None,
) -> UnpackResult:
    """Check ``bundle`` completely, then install its entries and merge its rows.

    The registry is opened (``open_registry``) only once every file has been
    checked in staging: a refused bundle must not leave a new, empty registry file
    behind. With ``trusted`` keys configured the metadata's signature is verified
    before anything else is believed; without them nothing is installed unless
    ``allow_unsigned`` (:func:`~warmcache.trust.require_trust`); ``max_bytes`` bounds what the file list may
    ask to write, checked before extraction and again while writing.

    :param bundle: the bundle file (``.tar``, ``.tar.gz``, ``.tgz`` or ``.tar.xz``).
    :param open_registry: opens the registry the rows merge into, called only once the bundle passed every check.
    :param cache_dir: the cache folder to install into (default: this machine's default folder of the bundle's layout).
    :param force: install even if the bundle was built with another toolchain.
    :param trusted: the public keys the bundle's signature must be from.
    :param allow_unsigned: install without a verified signature when no keys are configured.
    :param max_bytes: the most the bundle may write.
    :param progress: called as ``progress(done_bytes, total_bytes)`` while files are extracted.
    :raises CacheError: the bundle is not readable, not signed by a trusted key, altered, too large, or for another
        toolchain or layout; nothing is installed.
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
            return install_staged(
                meta,
                location,
                open_registry,
                lambda staging: _extract_all(tar, file_members, meta, staging, progress),
                f"bundle {bundle}",
            )
    except _ARCHIVE_ERRORS as exc:
        raise CacheError(f"{bundle}: not a readable bundle archive ({exc or type(exc).__name__}); refused") from None
    except OSError as exc:
        raise CacheError(f"{exc.filename or bundle}: {exc.strerror or exc}") from None


def _read_meta(tar: tarfile.TarFile, members: list[tarfile.TarInfo], bundle: Path, trusted: TrustedKeys) -> BundleMeta:
    if not members or members[0].name != META_NAME or not members[0].isfile():
        raise CacheError(f"{bundle}: not a warmcache bundle: its first member must be {META_NAME}")
    if members[0].size > MAX_META_BYTES:
        raise CacheError(
            f"{bundle}: {META_NAME} is {members[0].size} bytes, more than any real bundle needs "
            f"({MAX_META_BYTES}); refused"
        )
    handle = tar.extractfile(members[0])
    assert handle is not None
    where = f"{bundle}: {META_NAME}"
    raw, signature, flavor = read_signed_document(handle.read(), where, "bundle", BUNDLE_FORMAT, trusted)
    files = check_files(raw.get("files"), flavor, where)
    rows = check_rows(raw.get("rows"), where)
    for index, row in enumerate(rows):
        check_artifacts(row, files, flavor, f"{where}: rows[{index}]")
    return BundleMeta(flavor, rows, files, signature)


def _check_members(members: list[tarfile.TarInfo], meta: BundleMeta, bundle: Path) -> dict[str, tarfile.TarInfo]:
    """Every member is the metadata, a folder, or a listed regular file; every listed file is there."""
    found: dict[str, tarfile.TarInfo] = {}
    for member in members[1:]:
        where = f"{bundle}: member {shown(member.name)}"
        if member.issym() or member.islnk():
            raise CacheError(
                f"{where} is a link (to {shown(member.linkname)}); bundles carry regular files only; refused"
            )
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
            raise CacheError(
                f"{where} holds {member.size} bytes but the file list says {meta.files[path].size}; refused"
            )
        found[path] = member
    absent = sorted(set(meta.files) - set(found))
    if absent:
        raise CacheError(
            f"{bundle}: the file list names {CACHE_PREFIX}{absent[0]} but the bundle lacks it "
            f"({len(absent)} missing); refused"
        )
    return found


def _check_toolchain(meta: BundleMeta, bundle: Path) -> None:
    for row in meta.rows:
        local = current_toolchain(row["device"], row["backend"], row["mode"])
        if row["toolchain_hash"] != local.hash:
            differences = "; ".join(_differences(row["toolchain"], local.as_dict())) or "fingerprint differs"
            raise CacheError(
                f"{bundle}: built with another toolchain than this machine's for {row['model_name']} "
                f"({differences}): its graphs would not load here; pass --force to unpack anyway (its "
                "rows then read stale)"
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
        raise CacheError(
            f"{bundle}: bundle of layout {flavor}, but {root} holds a cache of layout "
            f"{detect_flavor(root)}; refused (pass another --cache-dir)"
        )


def _verify_contents(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], meta: BundleMeta) -> None:
    """Hash every member without writing it: a file that does not match its listed hash is refused
    before a byte of it reaches the disk (extraction then checks the hashes again as it writes)."""
    for path, member in _in_archive_order(members):
        source = tar.extractfile(member)
        assert source is not None
        expected = meta.files[path]
        check_blocks(_blocks(source), expected, f"{CACHE_PREFIX}{path}")


def _in_archive_order(members: dict[str, tarfile.TarInfo]) -> list[tuple[str, tarfile.TarInfo]]:
    """Members as they lie in the archive: a compressed stream is read once, never rewound."""
    return sorted(members.items(), key=lambda item: item[1].offset_data)


def _target(cache_dir: CacheFolder | None, flavor: CacheFlavor) -> CacheLocation:
    locations = locate_caches(cache_dir, None, flavor)
    if not locations:
        raise UsageError(f"no default {flavor} cache folder on this machine; pass --cache-dir DIR")
    return locations[0]


def _extract_all(
    tar: tarfile.TarFile,
    members: dict[str, tarfile.TarInfo],
    meta: BundleMeta,
    staging: Path,
    progress: ByteProgress | None,
) -> None:
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
    write_checked(
        _blocks(source), expected, target, where=f"{CACHE_PREFIX}{expected.path}", executable=bool(member.mode & 0o111)
    )


def _blocks(handle: IO[bytes]) -> Iterable[bytes]:
    return iter(lambda: handle.read(1 << 20), b"")
