"""Image layers: tar archives of the cache folder's own layout, built so that equal content gives equal bytes.

A layer holds whole cache entries at the paths ``pull`` would write them, so a container
runtime that applies the layers in order (a Kubernetes image volume) produces a ready
cache folder. Entries are spread over :data:`BUCKETS` layers by a hash of the entry's
path: adding or changing a shape rewrites only the layers its entries fall in, the others
keep their digests, and the registry stores and sends each of those once, across pushes,
tags and repositories. A fixed bucket count also bounds the layers per image (overlay
file systems stack a few hundred at most).

Archives are deterministic (sorted members, no owner, mtime 0, mode 0644/0755): the
same files give the same digest on any host, so two hosts pushing the same shapes
upload nothing twice. Layers are uncompressed (``...layer.v1.tar``): the digest is then
the ``diff_id`` too, and extraction needs no CPU for decompression.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from warmcache.cache.layout import CacheFlavor, entry_of
from warmcache.cache.noatime import open_quietly
from warmcache.errors import CacheError
from warmcache.shipping.bundle import BundleFile
from warmcache.shipping.install import write_checked
from warmcache.store.objects import changed_under_push

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
#: Data layers per image at most (plus one metadata layer).
BUCKETS = 32
_BLOCK = 1 << 20
#: An extended header (a pax record, a GNU long name) of a member warmcache writes is a few hundred bytes.
MAX_EXTENDED_HEADER_BYTES = 64 * 1024
#: Extended headers chained before one member (tarfile reads each chain by recursion).
MAX_EXTENDED_CHAIN = 4
#: Members of the metadata layer: its folder and two files, and room to spare.
MAX_METADATA_MEMBERS = 16
_EXTENDED = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


@dataclass(frozen=True, slots=True)
class Layer:
    """A built (or already stored) layer: its digest and size, and the files it holds by path."""

    digest: str
    size: int
    files: tuple[BundleFile, ...]


def member_bound(layer: Layer) -> int:
    """How many members the layer's tar holds at most: its files and the folders above them (as :func:`write_layer`
    writes them); a stream with more is not this layer."""
    return len(layer.files) + len(_parent_folders(f.path for f in layer.files))


def bucket_of(flavor: CacheFlavor, path: str) -> int:
    """The data layer a file goes in: decided by its entry's path alone, so an entry never straddles layers."""
    found = entry_of(flavor, path)
    entry = found[1] if found else path
    return int(hashlib.sha256(entry.encode()).hexdigest()[:8], 16) % BUCKETS


def by_bucket(flavor: CacheFlavor, files: Iterable[BundleFile]) -> list[tuple[BundleFile, ...]]:
    """The files grouped into their layers (each group sorted by path), in bucket order; empty buckets left out."""
    groups: dict[int, list[BundleFile]] = {}
    for file in files:
        groups.setdefault(bucket_of(flavor, file.path), []).append(file)
    return [tuple(sorted(group, key=lambda f: f.path)) for _, group in sorted(groups.items())]


def write_layer(
    out: Path, members: list[tuple[str, Path | bytes]], expected: dict[str, BundleFile] | None = None
) -> tuple[str, int]:
    """Write a deterministic tar of ``members`` (archive path, source file or bytes) to ``out``; its ``(digest, size)``.

    A source file is hashed as it is archived: if ``expected`` lists another sha256 or size
    for its path (the file changed since the index was built), nothing is written and
    :class:`CacheError` names the file.
    """
    digest = hashlib.sha256()
    with out.open("wb") as raw:
        sink = _HashingWriter(raw, digest)
        with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            for folder in _parent_folders(name for name, _ in members):
                tar.addfile(_info(folder, 0, tarfile.DIRTYPE, 0o755))
            for name, source in sorted(members, key=lambda m: m[0]):
                if isinstance(source, bytes):
                    tar.addfile(_info(name, len(source), tarfile.REGTYPE, 0o644), io.BytesIO(source))
                    continue
                listed = expected.get(name) if expected else None
                with open_quietly(source) as handle:
                    size = os.fstat(handle.fileno()).st_size
                    checked = _CheckedReader(handle, source, listed)
                    try:
                        tar.addfile(
                            _info(name, size, tarfile.REGTYPE, 0o755 if os.stat(source).st_mode & 0o111 else 0o644),
                            checked,
                        )
                    except OSError as exc:
                        # tarfile's "unexpected end of data": the file shrank
                        if exc.errno is None and listed is not None:
                            raise CacheError(changed_under_push(source, listed.sha256)) from None
                        raise
                    checked.finish(size)
        raw.flush()
        os.fsync(raw.fileno())
    return f"sha256:{digest.hexdigest()}", out.stat().st_size


def extract_files(
    blocks: Iterator[bytes],
    digest: str,
    wanted: dict[str, BundleFile],
    folder: Path,
    where: str,
    progress: Callable[[int], None] | None = None,
    *,
    max_members: int,
) -> set[str]:
    """Stream one layer and write each wanted file (by archive path) to ``folder/<sha256>``, checked; the paths found.

    Only regular members named in ``wanted`` are read, each with its size and sha256
    enforced while it is written (:func:`~warmcache.shipping.install.write_checked`); links,
    devices, other files and ``..`` paths are never written anywhere. Headers are bounded
    (:class:`_BoundedTarInfo`) and a layer with more than ``max_members`` members
    (:func:`member_bound`) is refused: tarfile keeps every header it reads. The layer's own
    digest is checked at the end: a layer that is not what the manifest names is refused
    (the files already checked stay: they are what the signed index says).
    """
    reader = _BlockReader(blocks, progress)
    found: set[str] = set()
    try:
        with tarfile.open(fileobj=reader, mode="r|", tarinfo=_BoundedTarInfo) as tar:  # type: ignore[call-overload]
            for count, member in enumerate(tar, 1):
                if count > max_members:
                    raise CacheError(
                        f"{where}: layer {digest[:19]} holds more than the {max_members} members its index lists; "
                        "refused"
                    )
                name = _normalised(member.name)
                file = wanted.get(name) if name is not None else None
                if name is None or file is None or not member.isreg() or name in found:
                    continue
                target = folder / file.sha256
                if not target.exists():
                    partial = folder / f"{file.sha256}.part-{uuid.uuid4().hex[:8]}"
                    try:
                        write_checked(
                            _member_blocks(tar, member), file, partial, where=f"{where} layer {digest[:19]} {name}"
                        )
                        os.replace(partial, target)
                    finally:
                        partial.unlink(missing_ok=True)
                found.add(name)
        reader.drain()
    except tarfile.TarError as exc:
        raise CacheError(f"{where}: layer {digest[:19]} is not a readable tar archive ({exc}); refused") from None
    if reader.digest() != digest:
        raise CacheError(
            f"{where}: layer {digest[:19]} does not hash to its digest (got {reader.digest()[:19]}): "
            "corrupt or tampered; refused"
        )
    return found


def _member_blocks(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    source = tar.extractfile(member)
    assert source is not None  # a regular member
    yield from iter(lambda: source.read(_BLOCK), b"")


def read_members(data: bytes, names: tuple[str, ...], where: str) -> dict[str, bytes]:
    """The small members of an in-memory layer (the metadata layer) that ``names`` lists, by name (absent ones left
    out)."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:", tarinfo=_BoundedTarInfo) as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_METADATA_MEMBERS:
                    raise CacheError(
                        f"{where}: the metadata layer holds more than {MAX_METADATA_MEMBERS} members; refused"
                    )
                name = _normalised(member.name)
                if name in names and name not in found and member.isreg():
                    extracted = tar.extractfile(member)
                    found[name] = extracted.read() if extracted else b""
    except tarfile.TarError as exc:
        raise CacheError(f"{where}: metadata layer is not a readable tar archive ({exc}); refused") from None
    return found


def _normalised(name: str) -> str | None:
    """A member name as a cache path (``./a/b`` → ``a/b``), or ``None`` for an absolute or climbing one."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts:
        return None
    return "/".join(parts)


def _parent_folders(names: Iterable[str]) -> list[str]:
    """Every folder above the members, parents first: runtimes create missing ones with their own modes otherwise."""
    folders: set[str] = set()
    for name in names:
        parts = name.split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(folders)


def _info(name: str, size: int, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode, info.mtime = size, kind, mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _BoundedTarInfo(tarfile.TarInfo):
    """A member header read within bounds: an extended header (pax, GNU long name) of at most
    :data:`MAX_EXTENDED_HEADER_BYTES`, at most :data:`MAX_EXTENDED_CHAIN` of them before a member, no sparse members.

    tarfile reads an extended header whole into memory, and a chain of them by recursion.
    """

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise tarfile.HeaderError("a sparse member, which warmcache never writes")
        if self.type not in _EXTENDED:
            return super()._proc_member(archive)  # type: ignore[misc]
        depth = getattr(archive, "_warmcache_chain", 0) + 1
        if self.size > MAX_EXTENDED_HEADER_BYTES or depth > MAX_EXTENDED_CHAIN:
            raise tarfile.HeaderError(
                f"an extended header of {self.size} bytes, {depth} in a row (at most {MAX_EXTENDED_HEADER_BYTES} "
                f"bytes, {MAX_EXTENDED_CHAIN} in a row)"
            )
        archive._warmcache_chain = depth  # type: ignore[attr-defined]
        try:
            return super()._proc_member(archive)  # type: ignore[misc]
        finally:
            archive._warmcache_chain = depth - 1  # type: ignore[attr-defined]


class _HashingWriter:
    """A write-only file that hashes what passes to the real one (tarfile writes blocks; the digest is the layer's)."""

    def __init__(self, raw: IO[bytes], digest: hashlib._Hash) -> None:
        self.raw, self.digest = raw, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.raw.write(data)

    def tell(self) -> int:
        return self.raw.tell()


class _CheckedReader:
    """A cache file read into the archive, hashed on the way, compared with its index entry at the end."""

    def __init__(self, handle: IO[bytes], path: Path, listed: BundleFile | None) -> None:
        self.handle, self.path, self.listed = handle, path, listed
        self.digest, self.count = hashlib.sha256(), 0

    def read(self, amount: int = -1) -> bytes:
        block = self.handle.read(amount)
        self.digest.update(block)
        self.count += len(block)
        return block

    def finish(self, size: int) -> None:
        if self.listed is None:
            return
        if self.count != size or self.count != self.listed.size or self.digest.hexdigest() != self.listed.sha256:
            raise CacheError(changed_under_push(self.path, self.listed.sha256))


class _BlockReader:
    """Download blocks as a readable stream for ``tarfile`` (``r|``), hashing every byte of the layer."""

    def __init__(self, blocks: Iterator[bytes], progress: Callable[[int], None] | None) -> None:
        self.blocks, self.progress = blocks, progress
        self.block, self.offset, self.hash = b"", 0, hashlib.sha256()

    def read(self, amount: int = -1) -> bytes:
        """Up to ``amount`` bytes (all that is left for -1); copies only what it returns (tar reads 10 KiB at a
        time)."""
        parts: list[bytes] = []
        left = amount
        while left != 0:
            if self.offset >= len(self.block):
                block = next(self.blocks, None)
                if block is None:
                    break
                self.hash.update(block)
                if self.progress:
                    self.progress(len(block))
                self.block, self.offset = block, 0
            take = len(self.block) - self.offset if left < 0 else min(left, len(self.block) - self.offset)
            parts.append(self.block[self.offset : self.offset + take])
            self.offset += take
            left = left - take if left > 0 else left
        return b"".join(parts)

    def drain(self) -> None:
        """Read what tar left (end-of-archive padding), so the digest covers the whole layer."""
        while self.read(_BLOCK):
            pass

    def digest(self) -> str:
        return f"sha256:{self.hash.hexdigest()}"
