"""Portable bundles: the cache entries a manifest's compiled shapes need, with their rows.

A bundle is a tar archive (``.tar``, ``.tar.gz``/``.tgz`` or ``.tar.xz``) holding

- ``warmcache-bundle.json`` (first member): format version, cache layout, the
  toolchains, the registry rows (JSON) and the file list with a sha256 and size
  for every file;
- ``cache/<path>``: the files of the entries those rows reference (their
  artifacts), paths relative to the cache root, plus every Inductor kernel file
  of the cache: kernels are shared between graphs and a row records only the
  kernels its own compile wrote (see ``layout.SHARED_KINDS``), so leaving the
  others out would make production recompile them.

This is how a deployment pipeline ships a warm cache into an image or a fleet:
``pack`` on the build machine, ``unpack`` (:mod:`warmcache.shipping.unbundle`) there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from warmcache.bounds import path_problem
from warmcache.cache.layout import SHARED_KINDS, WORK_DIR_PREFIX, list_entries
from warmcache.cache.locate import CacheLocation, flavor_of_kind
from warmcache.cache.noatime import open_quietly
from warmcache.errors import CacheError, UsageError, shown
from warmcache.identity.fingerprint import package_version
from warmcache.jsonable import fields_json
from warmcache.manifest import Manifest
from warmcache.registry import Registry, ShapeRecord
from warmcache.registry.models import utcnow
from warmcache.shipping.bundle_rows import row_to_json
from warmcache.shipping.shipment import ShipmentScope, records_to_ship
from warmcache.trust import SigningKey, sign_document
from warmcache.units import format_size

BUNDLE_FORMAT = 1
META_NAME = "warmcache-bundle.json"
CACHE_PREFIX = "cache/"
WriteMode = Literal["w", "w:gz", "w:xz"]
_WRITE_MODES: dict[str, WriteMode] = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.xz": "w:xz"}

#: ``progress(done_bytes, total_bytes)``, called as files are written.
ByteProgress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class BundleFile:
    """One file of the bundle: path relative to the cache root, sha256, size."""

    path: str
    sha256: str
    size: int


class ShippedJson:
    """What a pack or a push shipped, said alike (subclasses are dataclasses with a ``not_compiled`` field from
    :func:`records_to_ship`): both print that count as ``declared_but_not_compiled``, and both explain it."""

    __slots__ = ()

    def as_json(self) -> dict[str, Any]:
        return fields_json(self, {"not_compiled": "declared_but_not_compiled"})

    def not_shipped(self, verified_only: bool, left_out: str) -> str:
        """The note on the declared shapes left out, and why (``--verified-only``, or not compiled)."""
        count: int = getattr(self, "not_compiled")  # noqa: B009 (every subclass's field, not the base's)
        why = "verified" if verified_only else "compiled"
        return f"; {count} declared shapes {left_out} (not {why})" if count else ""


@dataclass(frozen=True, slots=True)
class PackResult(ShippedJson):
    output: Path
    #: The signing key's id; ``None`` for an unsigned bundle.
    signed_by: str | None
    rows: int
    entries: int
    files: int
    bytes: int
    not_compiled: int

    def message(self, verified_only: bool) -> str:
        """What ``bundle pack`` says it packed, signed and left out."""
        signed = f", signed by key {self.signed_by}" if self.signed_by else ", unsigned"
        return (
            f"{self.output}: {self.rows} compiled shapes, {self.entries} cache entries, "
            f"{self.files} files ({format_size(self.bytes)}){signed}"
            + self.not_shipped(verified_only, "are not in the bundle")
        )


def check_relpath(path: Any, where: str) -> str:
    """A safe, normalised POSIX path relative to a root, or :class:`CacheError` naming what is wrong."""
    if not isinstance(path, str) or not path:
        raise CacheError(f"{where}: {shown(path)} is not a file name")
    problem = path_problem(path)
    if problem:
        raise CacheError(f"{where}: {shown(path)} {problem}; refused")
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":") or "\\" in path:
        raise CacheError(f"{where}: {shown(path)} is an absolute path; refused")
    parts = [p for p in PurePosixPath(path).parts if p != "."]
    if ".." in parts:
        raise CacheError(f"{where}: {shown(path)} climbs out of the cache with '..'; refused")
    if not parts:
        raise CacheError(f"{where}: {shown(path)} names no file")
    if parts[0].startswith(WORK_DIR_PREFIX):
        raise CacheError(f"{where}: {shown(path)} is a warmcache work folder, not a cache entry; refused")
    return "/".join(parts)


def write_mode(output: Path) -> WriteMode:
    for suffix, mode in _WRITE_MODES.items():
        if output.name.endswith(suffix):
            return mode
    raise UsageError(f"-o {output}: name the bundle *.tar, *.tar.gz, *.tgz or *.tar.xz")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open_quietly(path) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack_bundle(
    scope: ShipmentScope,
    registry: Registry,
    output: Path,
    *,
    verified_only: bool = False,
    signing_key: SigningKey | None = None,
    progress: ByteProgress | None = None,
) -> PackResult:
    """Write the bundle of the manifest's compiled shapes to ``output`` (atomically: all or nothing).

    ``verified_only`` ships only shapes a fresh process replayed without compiling
    (``warmcache verify``), for pipelines that promote nothing unproven.
    ``signing_key`` signs the whole metadata (file list with hashes, rows,
    toolchain fingerprints), so that a host trusting the key can tell the bundle
    was not altered since.

    :param scope: the manifest's shapes (one model's, if it names one) and the cache folder holding their entries.
    :param registry: where the compiled rows are read.
    :param output: the bundle file; its suffix (``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.xz``) chooses compression.
    :param verified_only: ship only verified shapes.
    :param signing_key: sign the bundle's metadata with this key; ``None`` leaves it unsigned.
    :param progress: called as ``progress(done_bytes, total_bytes)`` while files are written.
    :raises CacheError: nothing compiled to ship, or a file cannot be read or written (nothing is left behind).
    """
    mode = write_mode(output)
    records, not_compiled = records_to_ship(registry, scope, verified_only)
    manifest, location = scope.manifest, scope.location
    try:
        entries = sorted(set(entries_needed(records, location)) | shared_kernels(location))
        files = [
            BundleFile(path, sha256_of(location.root / path), (location.root / path).stat().st_size)
            for path in entry_files(location.root, entries)
        ]
        meta = _meta(manifest, location, records, files)
        total = _write(
            output, mode, sign_document(meta, signing_key) if signing_key else meta, location.root, files, progress
        )
    except OSError as exc:
        # A read-only or full output folder, a cache file that vanished or shrank
        # mid-pack: one line naming the path, not a traceback.
        raise CacheError(f"{exc.filename or output}: {exc.strerror or exc}; bundle not written") from None
    return PackResult(
        output,
        signing_key.public.key_id if signing_key else None,
        len(records),
        len(entries),
        len(files),
        total,
        not_compiled,
    )


def _meta(
    manifest: Manifest, location: CacheLocation, records: list[ShapeRecord], files: list[BundleFile]
) -> dict[str, Any]:
    return {
        "format": BUNDLE_FORMAT,
        "created_at": utcnow().isoformat(),
        "created_by": f"warmcache {package_version('warmcache') or 'unknown'} on {socket.gethostname()}",
        "manifest": str(manifest.path),
        "flavor": location.flavor,
        "toolchains": {r.toolchain_hash: r.toolchain for r in records},
        "rows": [row_to_json(r) for r in records],
        "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in files],
    }


def _write(
    output: Path,
    mode: WriteMode,
    meta: dict[str, Any],
    root: Path,
    files: list[BundleFile],
    progress: ByteProgress | None,
) -> int:
    """Write the archive beside ``output`` and rename it into place; returns the bytes of cache files."""
    total = sum(f.size for f in files)
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    output.parent.mkdir(parents=True, exist_ok=True)
    now = utcnow().timestamp()
    try:
        with tarfile.open(partial, mode) as tar:
            blob = json.dumps(meta, indent=1, sort_keys=True).encode()
            tar.addfile(_tarinfo(META_NAME, len(blob), 0o644, now), io.BytesIO(blob))
            done = 0
            for f in files:
                source = root / f.path
                stat = source.stat()
                info = _tarinfo(
                    CACHE_PREFIX + f.path, f.size, 0o755 if stat.st_mode & 0o111 else 0o644, stat.st_mtime or now
                )
                with open_quietly(source) as handle:
                    try:
                        tar.addfile(info, handle)
                    except OSError as exc:
                        if exc.errno is None:  # tarfile's "unexpected end of data": the file shrank
                            raise OSError(None, f"changed while being packed ({exc})", str(source)) from None
                        raise
                done += f.size
                if progress:
                    progress(done, total)
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return total


def entries_needed(records: list[ShapeRecord], location: CacheLocation) -> list[str]:
    """Every entry the rows reference, checked to exist under the cache root."""
    entries: set[str] = set()
    for record in records:
        for artifact in record.artifacts:
            flavor = flavor_of_kind(artifact.kind)
            if flavor != location.flavor:
                raise UsageError(
                    f"row {record.model_name} batch={record.batch_size} seq={record.seq_len}: artifact kind "
                    f"{shown(artifact.kind)} is not "
                    f"in the {location.flavor} cache {location.root}; pack each model's cache separately with --model"
                )
            path = check_relpath(
                artifact.path,
                f"registry artifact of {record.model_name} batch={record.batch_size} seq={record.seq_len}",
            )
            if not os.path.lexists(location.root / path):
                raise CacheError(
                    f"{location.root / path}: cache entry of {record.model_name} {record.workload} "
                    f"batch={record.batch_size} "
                    f"seq={record.seq_len} is gone; run warmcache cache doctor --fix, then warmcache warmup"
                )
            entries.add(path)
    return sorted(entries)


def shared_kernels(location: CacheLocation) -> set[str]:
    return {entry for entry, kind in list_entries(location.root, location.flavor).items() if kind in SHARED_KINDS}


def entry_files(root: Path, entries: list[str]) -> Iterator[str]:
    """The regular files of each entry; a link or special file inside one is refused."""
    for entry in entries:
        path = root / entry
        candidates = (
            [path]
            if not path.is_dir() or path.is_symlink()
            else sorted(p for p in path.rglob("*") if not p.is_dir() or p.is_symlink())
        )
        for candidate in candidates:
            if candidate.is_symlink() or not candidate.is_file():
                raise CacheError(
                    f"{candidate}: not a regular file (link or special file); bundles carry regular files only"
                )
            yield candidate.relative_to(root).as_posix()


def _tarinfo(name: str, size: int, mode: int, mtime: float) -> tarfile.TarInfo:
    """A member with no owner: unpacking must not depend on the packer's users."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, int(mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
